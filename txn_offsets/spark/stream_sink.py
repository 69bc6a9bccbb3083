"""Deprecated: moved to :mod:`txn_offsets.spark.stream.sink`.

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.spark.stream.sink import ExactlyOnceSink

__all__ = ["ExactlyOnceSink"]

warnings.warn(
    "txn_offsets.spark.stream_sink is deprecated: import from txn_offsets.spark.stream.sink",
    DeprecationWarning,
    stacklevel=2,
)
