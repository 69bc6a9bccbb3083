"""The DataFrame execution path: a batch's tasks without the RDD API (Spark Connect has none).

One Spark partition per task group: ``spark.range(0, n, 1, n)`` has exactly one row per partition,
its id being the group's index (``repartition(n)`` would not guarantee that, SPARK-40407). A
``mapInArrow`` function then runs the same task bodies as the RDD path (:class:`PartitionTask`,
:class:`ReadTask`) on the group's ranges: a group always reaches a task through its row, so a range
with no visible record (markers only) still commits. Task reports travel back as pickled bytes in a
binary column, so their errors reach the driver with their context (``TxnOffsetsError.__reduce__``).

Functions are pickled by reference to their module: the Python workers of the Spark server must be
able to import txn_offsets and the job's own modules. When they cannot, :func:`worker_imports`
turns the worker's ModuleNotFoundError into a :class:`ConfigError` that says how to fix it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import json
import operator
import pickle
import re
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, Literal, get_args

from txn_offsets.errors import ConfigError
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import PackedRanges, packed_ranges
from txn_offsets.spark import session
from txn_offsets.spark.heap import collector_paused
from txn_offsets.spark.reports import Reporting, unpacked
from txn_offsets.spark.tasks import PartitionTask, TaskReport

__all__ = [
    "EXECUTION_PATHS",
    "Execution",
    "arrow_batches",
    "batch_of",
    "batch_value",
    "check_execution",
    "record_schema",
    "records_frame",
    "run_tasks",
    "worker_imports",
]

# how a batch's tasks run: "auto" (from the session), "rdd" (classic Spark) or "dataframe" (any)
Execution = Literal["auto", "rdd", "dataframe"]
EXECUTION_PATHS: tuple[Execution, ...] = get_args(Execution)


@functools.cache
def record_schema() -> Any:
    """The batch's records as a DataFrame (a pyspark StructType): the columns of Spark's own Kafka
    source, minus timestampType. (Built on first use: importing txn_offsets does not import pyspark.)"""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("headers", ArrayType(header)),
        ]
    )


@functools.cache
def _report_schema() -> Any:
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("report", BinaryType(), nullable=False)])


TaskBody = Callable[[int, Iterable[Any]], Iterator[Any]]
Groups = tuple[tuple[int, ...], ...]  # range indexes per Spark task


def check_execution(execution: object, spark: Any = None) -> Execution:
    """Validate an ``execution`` setting: 'auto' (from the session), 'rdd' or 'dataframe'; with
    `spark`, also that the session can take that path."""
    found = next((path for path in EXECUTION_PATHS if path == execution), None)
    if found is None:
        raise ConfigError(
            "execution",
            f"{execution!r}: use 'auto' (the DataFrame path on Spark Connect, the RDD path on classic "
            f"Spark), 'rdd' (classic Spark only) or 'dataframe' (any session)",
        )
    if execution == "rdd" and spark is not None and session.is_connect(spark):
        raise ConfigError(
            "execution", "'rdd' needs a classic SparkSession: Spark Connect has no RDD API (use 'auto')"
        )
    return found


# (session key, tasks) -> that session's spark.range(0, tasks, 1, tasks): a DataFrame keeps its
# analysed schema, which mapInArrow asks for (its columns), so every batch after a session's first
# of that many tasks skips a JVM round trip (classic) or an AnalyzePlan RPC (Spark Connect)
_TASK_FRAMES: dict[tuple[str, int], Any] = {}
_TASK_FRAMES_MAX = 64


def task_frame(spark: Any, tasks: int) -> Any:
    """A DataFrame of `tasks` partitions holding one row each: the task's group index."""
    key = (session.session_key(spark), tasks)
    frame = _TASK_FRAMES.get(key)
    if frame is None or frame.sparkSession is not spark:  # (a classic key is id(spark): reusable)
        frame = spark.range(0, tasks, 1, tasks)
        if len(_TASK_FRAMES) >= _TASK_FRAMES_MAX:
            _TASK_FRAMES.clear()
        _TASK_FRAMES[key] = frame
    return frame


def run_tasks(spark: Any, groups: Sequence[tuple[int, ...]], task: PartitionTask[Any]) -> list[TaskReport]:
    """Run `task` once per group, one Spark task each; the reports, in group order (each Spark
    task's as one row: :mod:`txn_offsets.spark.reports`). A classic session runs the same DataFrame
    for every batch of a run (:func:`_run_frame`); a Spark Connect session a new one per batch."""
    if not session.is_connect(spark) and session.pinned_threads():
        reused = _run_frame(spark, len(groups), task)
        batch = batch_value(reused.token, groups, task)
        with worker_imports(), session.local_property(spark, _BATCH_PROPERTY, batch):
            pickled = [row[0] for row in reused.frame.collect()]
    else:
        frame = task_frame(spark, len(groups)).mapInArrow(
            functools.partial(_report_batches, Reporting(task), tuple(groups)), _report_schema()
        )
        with worker_imports():
            pickled = _collected_reports(spark, frame)
    # the bytes were pickled by our own task body in this job's Spark tasks (the same trust as the
    # results an RDD's collect() unpickles)
    return unpacked(task.ranges, [pickle.loads(packed) for packed in pickled])  # noqa: S301


# A classic session's DataFrame path runs one mapInArrow DataFrame for every batch of a run: building
# one per batch cost 46-49 ms of a ~200 ms small batch (pickling the task into a new Python UDF and
# the JVM analysing the new plan, ~29 py4j round trips), where an RDD job costs nothing to build; a
# DataFrame collected again reuses its analysed and planned query. A run's task is the same from one
# batch to the next but for its ranges and batch number: those reach the Spark tasks in a local
# property of the driver thread that runs the job (Spark gives each task its job's local properties,
# PySpark passes them to the Python workers). They are topics, partitions and offsets - no setting,
# secret or record: the database and Kafka settings stay in the function, pickled once a run.
# (Spark writes a job's local properties into its event log, when one is kept.)
_BATCH_PROPERTY = "txn_offsets.batch"


@dataclasses.dataclass(frozen=True, eq=False)
class _RunFrame:
    session: str  # session.session_key
    tasks: int
    template: PartitionTask[Any]  # the run's task without its ranges and batch number
    token: str  # which DataFrame a batch property is for
    frame: Any


# the DataFrames of the last runs, most recent last (a run has one per number of tasks it used)
_RUN_FRAMES: list[_RunFrame] = []
_RUN_FRAMES_MAX = 16
_RUN_FRAMES_LOCK = threading.Lock()


def _run_frame(spark: Any, tasks: int, task: PartitionTask[Any]) -> _RunFrame:
    """The DataFrame that runs `task`'s run on `tasks` Spark tasks, built by its first batch."""
    template = dataclasses.replace(task, ranges=(), batch=None)
    key = session.session_key(spark)
    with _RUN_FRAMES_LOCK:
        for entry in reversed(_RUN_FRAMES):
            same = (entry.session, entry.tasks) == (key, tasks) and entry.frame.sparkSession is spark
            if same and entry.template == template:
                return entry
        token = uuid.uuid4().hex
        frame = task_frame(spark, tasks).mapInArrow(_PropertyBatch(template, token), _report_schema())
        entry = _RunFrame(key, tasks, template, token, frame)
        _RUN_FRAMES.append(entry)
        del _RUN_FRAMES[:-_RUN_FRAMES_MAX]
        return entry


def batch_value(token: str, groups: Sequence[tuple[int, ...]], task: PartitionTask[Any]) -> str:
    """The local property that carries `task`'s batch (its number, groups and ranges) to the Spark
    tasks of the DataFrame of `token`."""
    return json.dumps([token, task.batch, groups, packed_ranges(task.ranges)], separators=(",", ":"))


def batch_of(
    value: str | None, token: str, template: PartitionTask[Any]
) -> tuple[PartitionTask[Any], Groups]:
    """`template`'s task for the batch that `value` (:func:`batch_value`) carries, and its groups;
    a RuntimeError when it carries none for the DataFrame of `token`."""
    batch = json.loads(value) if value else None
    if not batch or batch[0] != token:
        # a Spark job of this DataFrame that run_tasks did not start: nothing is read or committed
        raise RuntimeError(
            f"this Spark job carries no txn_offsets batch for its DataFrame (local property "
            f"{_BATCH_PROPERTY!r}): it runs only from txn_offsets.spark.frames.run_tasks"
        )
    _, number, groups, ranges = batch
    task = dataclasses.replace(template, ranges=PackedRanges(tuple(r) for r in ranges), batch=number)
    return task, tuple(tuple(g) for g in groups)


@dataclasses.dataclass(frozen=True, eq=False)  # by identity: its settings need not be hashable
class _PropertyBatch:
    """A run's mapInArrow function: the batch's task, rebuilt from its Spark job's batch property."""

    template: PartitionTask[Any]
    token: str

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        value = context.getLocalProperty(_BATCH_PROPERTY) if context is not None else None
        task, groups = batch_of(value, self.token, self.template)
        yield from _report_batches(Reporting(task), groups, batches)


def _collected_reports(spark: Any, frame: Any) -> list[bytes]:
    """The report column of `frame`, collected. Under Spark Connect from the Arrow table the
    client fetches (what its ``collect()`` converts: ``collect()`` asks the server for a setting
    first, ``spark.sql.execution.pyspark.binaryAsBytes``, one Config RPC of ~10 ms per batch), and
    without reattachable execution (:func:`_plain_client`); a client without these collects."""
    plain = _plain_client(spark) if session.is_connect(spark) else None
    plan = getattr(frame, "_plan", None)
    if plain is None or plan is None:
        return [row[0] for row in frame.collect()]
    table, _schema, _info = plain.to_table(plan.to_proto(plain), plan.observations)
    return [bytes(report) for report in table.column(0).to_pylist()]


def _plain_client(spark: Any) -> Any:
    """A copy of the Connect session's client that runs its plans without reattachable execution
    (the session's own client, which other threads and the user's queries share, is left as it
    is), or None when the client lacks what that takes. A reattachable execution sends the
    server a ReleaseExecute for each response it reads (a report table comes in ~7 responses):
    ~10 ms of a small batch, 11 % (scratch A/B, 8 partitions, cap 1,000). What it buys, resuming a
    long result stream after the connection dropped, a batch does not need: a report stream that
    breaks fails the batch, and the run plans again from the stored offsets (the guard tells what
    its tasks committed)."""
    client: Any = getattr(spark, "client", None)
    if not all(hasattr(client, name) for name in ("to_table", "disable_reattachable_execute")):
        return None
    return copy.copy(client).disable_reattachable_execute()


def records_frame(spark: Any, groups: Sequence[tuple[int, ...]], body: TaskBody, batch_size: int) -> Any:
    """A DataFrame (:func:`record_schema`) of every visible record of the groups' ranges, read by
    `body` (a ReadTask), each range in offset order, in Arrow batches of at most `batch_size`."""
    return task_frame(spark, len(groups)).mapInArrow(
        functools.partial(_record_batches, body, tuple(groups), batch_size), record_schema()
    )


def _group_ids(batches: Iterable[Any]) -> list[int]:
    # read the input to its end first (as the RDD path does): a worker is only reused when its
    # input was consumed completely
    return [int(i) for batch in batches for i in batch.column(0).to_pylist()]


def _report_batches(
    body: TaskBody, groups: tuple[tuple[int, ...], ...], batches: Iterable[Any]
) -> Iterator[Any]:
    import pyarrow as pa

    schema = pa.schema([pa.field("report", pa.binary(), nullable=False)])
    for g in _group_ids(batches):
        for packed in body(g, [groups[g]]):
            yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(packed)], pa.binary())], schema=schema)


def _record_batches(
    body: TaskBody, groups: tuple[tuple[int, ...], ...], batch_size: int, batches: Iterable[Any]
) -> Iterator[Any]:
    ids = _group_ids(batches)
    yield from arrow_batches((rec for g in ids for rec in body(g, [groups[g]])), batch_size)


def arrow_batches(records: Iterable[Record], batch_size: int) -> Generator[Any, None, None]:
    """`records` as pyarrow RecordBatches of :func:`record_schema`, at most `batch_size` rows each."""
    it = iter(records)
    with collector_paused():  # a tuple per record, thousands held in the chunk: no cycles
        while chunk := list(itertools.islice(it, batch_size)):
            yield _arrow_records(chunk)


# each field of a Record by position: a chunk's columns are taken one field at a time (zip(*records)
# passes every record as an argument: 4x as long for a chunk of 10,000, ~1 us a record here)
_FIELDS = {name: operator.itemgetter(i) for i, name in enumerate(Record._fields)}


def _column(records: list[Record], name: str) -> list[Any]:
    return list(map(_FIELDS[name], records))


def _arrow_records(records: list[Record]) -> Any:
    import pyarrow as pa

    headers = _column(records, "headers")
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    if any(headers):
        header_column = pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], pa.list_(header))
    else:  # the common case, without a Python object per record
        empty = pa.array([0] * (len(records) + 1), pa.int32())
        header_column = pa.ListArray.from_arrays(empty, pa.array([], header))
    timestamps = pa.array(_column(records, "timestamp_ms"), pa.timestamp("ms", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(_column(records, "key"), pa.binary()),
            pa.array(_column(records, "value"), pa.binary()),
            pa.array(_column(records, "topic"), pa.string()),
            pa.array(_column(records, "partition"), pa.int32()),
            pa.array(_column(records, "offset"), pa.int64()),
            # Spark's TimestampType is microseconds since the epoch, UTC
            timestamps.cast(pa.timestamp("us", tz="UTC")),
            header_column,
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "headers"],
    )


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


@contextlib.contextmanager
def worker_imports() -> Iterator[None]:
    """Turn a Spark failure caused by a module the Python workers cannot import into a ConfigError
    naming the module and the fix; any other failure passes through unchanged."""
    try:
        yield
    except Exception as exc:
        found = _MISSING_MODULE.search(str(exc))
        if found is None:
            raise
        raise ConfigError(
            "python workers",
            f"the Spark workers cannot import module {found.group(1)!r} (ModuleNotFoundError): task "
            f"functions are pickled by reference to their modules. Ship the job's own modules with "
            f"spark-submit --py-files <module>.py,<package>.zip (a Spark Connect session: "
            f"spark.addArtifacts('<module>.py' or '<package>.zip', pyfile=True)), and txn_offsets with "
            f"its dependencies in the executors' Python: installed on the nodes, or a packed "
            f"environment (spark-submit --archives job-env.tar.gz#env, docs/operations.md)",
        ) from exc
