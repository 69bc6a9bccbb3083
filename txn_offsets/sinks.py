"""Deprecated: moved to :mod:`txn_offsets.upserts`, named for what it holds (``upsert_add`` is
also ``txn_offsets.upsert_add``).

Kept for one release so that old imports still work; importing it warns. ``COPY_MIN_ROWS`` is
read from :mod:`txn_offsets.upserts`: change it there, not here.
"""

import warnings

from txn_offsets.upserts import COPY_MIN_ROWS, upsert_add

__all__ = ["COPY_MIN_ROWS", "upsert_add"]

warnings.warn(
    "txn_offsets.sinks is deprecated: import upsert_add from txn_offsets (or txn_offsets.upserts)",
    DeprecationWarning,
    stacklevel=2,
)
