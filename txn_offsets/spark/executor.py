"""Deprecated: moved to :mod:`txn_offsets.spark.tasks` (the bodies a Spark task runs).

Kept for one release so that old imports still work; importing it warns. The task bodies are
defined only in the new module (Spark pickles them by that module's path); ``decoded`` moved on to
:mod:`txn_offsets.spark.records`; the worker engine
cache moved to :mod:`txn_offsets.store.database`, the dead letters to
:mod:`txn_offsets.store.dead_letters`.
"""

import warnings

from txn_offsets.spark.records import decoded
from txn_offsets.spark.tasks import (
    PartitionTask,
    ReadOptions,
    ReadTask,
    TaskReport,
    commit_reporting,
    success_counts,
)
from txn_offsets.store.database import dispose_worker_engines, worker_engine
from txn_offsets.store.dead_letters import DeadLetter, write_dead_letters

__all__ = [
    "DeadLetter",
    "PartitionTask",
    "ReadOptions",
    "ReadTask",
    "TaskReport",
    "commit_reporting",
    "decoded",
    "dispose_worker_engines",
    "success_counts",
    "worker_engine",
    "write_dead_letters",
]

warnings.warn(
    "txn_offsets.spark.executor is deprecated: import from txn_offsets.spark.tasks",
    DeprecationWarning,
    stacklevel=2,
)
