"""txn_offsets: exactly-once processing from Apache Kafka into PostgreSQL for PySpark jobs.

The public API: settings (:class:`DatabaseSettings`, :class:`KafkaSettings`, :func:`from_env`),
the job runner (:func:`run_job` with a :class:`PartitionWriter` or :class:`BatchWriter`), the
Structured Streaming adapter (:func:`open_stream`: ``readStream.format("txn_offsets")`` and an
exactly-once sink), start policies and limits, the set-based sink helper :func:`upsert_add`, and
the error classes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from txn_offsets._version import __version__
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

if TYPE_CHECKING:
    from txn_offsets.config import DatabaseSettings, KafkaSettings, from_env
    from txn_offsets.kafka.records import Record
    from txn_offsets.kafka.start import StartPolicy
    from txn_offsets.plan.planner import Limits
    from txn_offsets.ranges import OffsetRange
    from txn_offsets.redaction import Secret
    from txn_offsets.spark.lowlatency import LowLatency
    from txn_offsets.spark.runner import run_job
    from txn_offsets.spark.session import local_session
    from txn_offsets.spark.stream.query import open_stream
    from txn_offsets.spark.summary import BatchReport, JobSummary
    from txn_offsets.spark.writers import BatchWriter, PartitionWriter
    from txn_offsets.upserts import upsert_add

#: each public name's module but the error classes' (light: imported with the package), imported
#: when the name is first looked up (PEP 562): ``import txn_offsets`` - which the ``txn-offsets``
#: command, every fresh Spark Python worker and the Structured Streaming source's runner run first,
#: as any import of a submodule does - no longer loads Spark's runner, the planner, SQLAlchemy,
#: psycopg and librdkafka before anything asks for them (a fresh process: 0.8-1.4 -> 0.1 s;
#: ``txn-offsets --version`` 1.0-1.9 -> 0.8-1.5 s: the command's own modules need the store)
_MODULES = {
    **dict.fromkeys(("DatabaseSettings", "KafkaSettings", "from_env"), "txn_offsets.config"),
    "Record": "txn_offsets.kafka.records",
    "StartPolicy": "txn_offsets.kafka.start",
    "Limits": "txn_offsets.plan.planner",
    "OffsetRange": "txn_offsets.ranges",
    "Secret": "txn_offsets.redaction",
    "LowLatency": "txn_offsets.spark.lowlatency",
    "run_job": "txn_offsets.spark.runner",
    "local_session": "txn_offsets.spark.session",
    **dict.fromkeys(("BatchReport", "JobSummary"), "txn_offsets.spark.summary"),
    **dict.fromkeys(("BatchWriter", "PartitionWriter"), "txn_offsets.spark.writers"),
    "open_stream": "txn_offsets.spark.stream.query",  # imports pyspark
    "upsert_add": "txn_offsets.upserts",
}

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
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'txn_offsets' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
