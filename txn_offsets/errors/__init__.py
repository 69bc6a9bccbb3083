"""The library's errors: one root, every subclass carries its context as attributes.

Messages are built from the attributes and always say what to fix. No message ever contains a
password: database URLs are rendered through :func:`txn_offsets.config.redact_url` before they reach
an error. Families by base class (:mod:`txn_offsets.errors.base`): ``Transient`` errors are retried
by ``run_job``; an error's ``outcome`` is how a task reports it.
"""

from txn_offsets.errors.base import ConfigError, Transient, TxnOffsetsError
from txn_offsets.errors.batch import (
    BatchFailed,
    ClaimBlocked,
    CommitNotApplied,
    DataLoss,
    FenceCause,
    Fenced,
    FencedBy,
    KafkaReadError,
    OffsetConflict,
    OffsetsMovedOn,
    OffsetsRolledBack,
    RecordRejected,
    RecordsNotConsumed,
    RunCommitted,
    StreamDiverged,
    TopicChanged,
    TransactionAborted,
    WriteFailed,
)
from txn_offsets.errors.environment import (
    JavaNotFound,
    JobAlreadyRunning,
    MigrationError,
    SchemaMissing,
    ServiceUnavailable,
    StackError,
    TopicMissing,
    UnknownJob,
)

__all__ = [
    "BatchFailed",
    "ClaimBlocked",
    "CommitNotApplied",
    "ConfigError",
    "DataLoss",
    "FenceCause",
    "Fenced",
    "FencedBy",
    "JavaNotFound",
    "JobAlreadyRunning",
    "KafkaReadError",
    "MigrationError",
    "OffsetConflict",
    "OffsetsMovedOn",
    "OffsetsRolledBack",
    "RecordRejected",
    "RecordsNotConsumed",
    "RunCommitted",
    "SchemaMissing",
    "ServiceUnavailable",
    "StackError",
    "StreamDiverged",
    "TopicChanged",
    "TopicMissing",
    "TransactionAborted",
    "Transient",
    "TxnOffsetsError",
    "UnknownJob",
    "WriteFailed",
]
