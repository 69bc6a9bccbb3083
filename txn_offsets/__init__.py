"""txn_offsets: exactly-once processing from Apache Kafka into PostgreSQL for PySpark jobs.

The public API: settings (:class:`DatabaseSettings`, :class:`KafkaSettings`, :func:`from_env`),
the job runner (:func:`run_job` with a :class:`PartitionWriter` or :class:`BatchWriter`), the
Structured Streaming adapter (:func:`open_stream`: ``readStream.format("txn_offsets")`` and an
exactly-once sink), start policies and limits, the set-based sink helper :func:`upsert_add`, and
the error classes.
"""

from txn_offsets._version import __version__
from txn_offsets.config import DatabaseSettings, KafkaSettings, from_env
from txn_offsets.errors import (
    BatchFailed,
    ClaimBlocked,
    CommitNotApplied,
    ConfigError,
    DataLoss,
    Fenced,
    JavaNotFound,
    JobAlreadyRunning,
    KafkaReadError,
    MigrationError,
    OffsetConflict,
    OffsetsMovedOn,
    OffsetsRolledBack,
    RecordRejected,
    RecordsNotConsumed,
    SchemaMissing,
    ServiceUnavailable,
    StackError,
    StreamDiverged,
    TopicChanged,
    TopicMissing,
    TransactionAborted,
    TxnOffsetsError,
    UnknownJob,
    WriteFailed,
)
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.spark.lowlatency import LowLatency
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.session import local_session
from txn_offsets.spark.summary import BatchReport, JobSummary
from txn_offsets.spark.writers import BatchWriter, PartitionWriter
from txn_offsets.upserts import upsert_add

__all__ = [
    "BatchFailed",
    "BatchReport",
    "BatchWriter",
    "ClaimBlocked",
    "CommitNotApplied",
    "ConfigError",
    "DataLoss",
    "DatabaseSettings",
    "Fenced",
    "JavaNotFound",
    "JobAlreadyRunning",
    "JobSummary",
    "KafkaReadError",
    "KafkaSettings",
    "Limits",
    "LowLatency",
    "MigrationError",
    "OffsetConflict",
    "OffsetRange",
    "OffsetsMovedOn",
    "OffsetsRolledBack",
    "PartitionWriter",
    "Record",
    "RecordRejected",
    "RecordsNotConsumed",
    "SchemaMissing",
    "Secret",
    "ServiceUnavailable",
    "StackError",
    "StartPolicy",
    "StreamDiverged",
    "TopicChanged",
    "TopicMissing",
    "TransactionAborted",
    "TxnOffsetsError",
    "UnknownJob",
    "WriteFailed",
    "__version__",
    "from_env",
    "local_session",
    "open_stream",
    "run_job",
    "upsert_add",
]


def __getattr__(name: str) -> object:
    # the streaming adapter imports pyspark: only when asked for
    if name == "open_stream":
        from txn_offsets.spark.stream.query import open_stream

        return open_stream
    raise AttributeError(f"module 'txn_offsets' has no attribute {name!r}")
