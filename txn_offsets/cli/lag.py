"""Deprecated: moved to :mod:`txn_offsets.admin.lag`.

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.admin.lag import LagReport, PartitionLag, offset_lag, partition_lags

__all__ = ["LagReport", "PartitionLag", "offset_lag", "partition_lags"]

warnings.warn(
    "txn_offsets.cli.lag is deprecated: import from txn_offsets.admin.lag",
    DeprecationWarning,
    stacklevel=2,
)
