"""Deprecated: moved to :mod:`txn_offsets.spark.stream.source`.

Kept for one release so that old imports still work; importing it warns. The source class is
defined only in the new module (Spark registers and pickles it by that module's path).
"""

import warnings

from txn_offsets.spark.stream.source import FORMAT, StreamConfig, TxnOffsetsSource, bound_source

__all__ = ["FORMAT", "StreamConfig", "TxnOffsetsSource", "bound_source"]

warnings.warn(
    "txn_offsets.spark.stream_source is deprecated: import from txn_offsets.spark.stream.source",
    DeprecationWarning,
    stacklevel=2,
)
