"""Deprecated: the plain functions behind the admin CLI moved to :mod:`txn_offsets.admin`
(:mod:`~txn_offsets.admin.reset`, :mod:`~txn_offsets.admin.views`, :mod:`~txn_offsets.admin.lag`).

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.admin.lag import LagReport, PartitionLag, offset_lag
from txn_offsets.admin.moves import Move as PlanStep
from txn_offsets.admin.reset import ResetPlan, ResetTarget, apply_reset, plan_reset
from txn_offsets.admin.views import AuditRow, JobRow, OffsetRow, audit_log, list_jobs, show_offsets

__all__ = [
    "AuditRow",
    "JobRow",
    "LagReport",
    "OffsetRow",
    "PartitionLag",
    "PlanStep",
    "ResetPlan",
    "ResetTarget",
    "apply_reset",
    "audit_log",
    "list_jobs",
    "offset_lag",
    "plan_reset",
    "show_offsets",
]

warnings.warn(
    "txn_offsets.cli.commands is deprecated: import from txn_offsets.admin.reset, "
    "txn_offsets.admin.views or txn_offsets.admin.lag",
    DeprecationWarning,
    stacklevel=2,
)
