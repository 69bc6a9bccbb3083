"""Deprecated: moved to :mod:`txn_offsets.spark.stream.query` (use ``txn_offsets.open_stream``).

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.spark.stream.query import TxnStream, open_stream

__all__ = ["TxnStream", "open_stream"]

warnings.warn(
    "txn_offsets.spark.streaming is deprecated: import open_stream from txn_offsets "
    "(or txn_offsets.spark.stream.query)",
    DeprecationWarning,
    stacklevel=2,
)
