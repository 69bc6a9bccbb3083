"""Deprecated: moved to :mod:`txn_offsets.devstack.cluster` (a dev helper, beside the local stack).

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.devstack.cluster import StandaloneCluster

__all__ = ["StandaloneCluster"]

warnings.warn(
    "txn_offsets.spark.cluster is deprecated: import StandaloneCluster from txn_offsets.devstack.cluster",
    DeprecationWarning,
    stacklevel=2,
)
