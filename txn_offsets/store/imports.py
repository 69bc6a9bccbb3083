"""Deprecated: moved to :mod:`txn_offsets.admin.imports` (the plan and its transaction) and
:mod:`txn_offsets.admin.sources` (``read_table``).

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.admin.imports import ImportPlan, ImportStep, apply_import, plan_import, select_topics
from txn_offsets.admin.sources import read_table

__all__ = ["ImportPlan", "ImportStep", "apply_import", "plan_import", "read_table", "select_topics"]

warnings.warn(
    "txn_offsets.store.imports is deprecated: import from txn_offsets.admin.imports "
    "(read_table: txn_offsets.admin.sources)",
    DeprecationWarning,
    stacklevel=2,
)
