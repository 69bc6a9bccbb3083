"""txn_offsets: exactly-once processing from Apache Kafka into PostgreSQL for PySpark jobs."""

from importlib.metadata import PackageNotFoundError, version

from txn_offsets.errors import (
    CommitNotApplied,
    ConfigError,
    DataLoss,
    Fenced,
    JavaNotFound,
    JobAlreadyRunning,
    KafkaReadError,
    MigrationError,
    OffsetConflict,
    RecordRejected,
    SchemaMissing,
    ServiceUnavailable,
    StackError,
    TxnOffsetsError,
    UnknownJob,
)

try:
    __version__ = version("txn-offsets")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "CommitNotApplied",
    "ConfigError",
    "DataLoss",
    "Fenced",
    "JavaNotFound",
    "JobAlreadyRunning",
    "KafkaReadError",
    "MigrationError",
    "OffsetConflict",
    "RecordRejected",
    "SchemaMissing",
    "ServiceUnavailable",
    "StackError",
    "TxnOffsetsError",
    "UnknownJob",
    "__version__",
]
