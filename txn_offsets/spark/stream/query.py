"""Exactly-once Structured Streaming: ``open_stream`` -> ``readStream.format("txn_offsets")`` -> sink.

::

    with open_stream(spark, job="pageviews", kafka=k, database=db, topics=["pageviews"],
                     checkpoint_root="/var/lib/jobs/checkpoints") as stream:
        records = spark.readStream.format("txn_offsets").option("job", "pageviews").load()
        query = stream.start(records, compute_df=count_rows, write=upsert_counts, interval_s=1.0)
        query.awaitTermination()

``open_stream`` starts a run of the job (a new generation: it fences every older run, like
``run_job``) and registers the ``txn_offsets`` source for it in the session. ``stream.start`` writes
the stream with the exactly-once sink (:class:`ExactlyOnceSink` in ``foreachBatch``) and a checkpoint
location of its own generation: ``<checkpoint_root>/<job>/generation-<g>``. A new run therefore never
resumes an old checkpoint; it plans from the offset table (which a reset may have moved).
Checkpoints of older generations are no longer read and can be deleted.

Between the source and the sink only stateless transformations (select, filter, withColumn...)
belong: the batch's aggregation goes in ``compute_df``, whose result is committed with the batch's
offsets. Streaming state (a streaming groupBy, dropDuplicates, joins with state) lives in the
checkpoint, which each run starts afresh, so it is refused.

When to use which: ``run_job`` is the library's own loop (both writers, per-range commits in the
tasks, retries of transient failures, the Kafka group mirror); a stream is for code built on
Structured Streaming (triggers, ``StreamingQuery`` monitoring, availableNow backfills). Both keep
the same table, so a job can move between them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.session import session_cores, session_key
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.spark.stream.running import RunQuery, run_checkpoint
from txn_offsets.spark.stream.sink import ExactlyOnceSink
from txn_offsets.spark.stream.source import FORMAT, StreamConfig, bound_source
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.store.runs import Run

__all__ = ["TxnStream", "open_stream"]

logger = logging.getLogger(__name__)

# the streams open per Spark session (session id -> job -> config): the registered source knows all
_open: dict[str, dict[str, StreamConfig]] = {}
_open_lock = threading.Lock()

# physical operators that keep streaming state (each also prints "state info [...]")
_STATEFUL = frozenset(
    {
        "StateStoreSave",
        "StateStoreRestore",
        "SessionWindowStateStoreSave",
        "SessionWindowStateStoreRestore",
        "StreamingDeduplicate",
        "StreamingDeduplicateWithinWatermark",
        "StreamingGlobalLimit",
        "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState",
        "TransformWithState",
        "TransformWithStateInPandas",
        "TransformWithStateInPySpark",
        "StreamingSymmetricHashJoin",
    }
)
# a plan tree line: its prefix (indentation, branches, codegen stage, "~" for streaming), the node
_NODE = re.compile(r"^[\s:|+\-~]*(?:\*\(\d+\)\s*)?([A-Za-z]\w*)(.*)$")


def open_stream(
    spark: Any,
    *,
    job: str,
    kafka: KafkaSettings,
    database: DatabaseSettings,
    checkpoint_root: str,
    topics: Sequence[str] = (),
    topic_pattern: str | None = None,
    start: StartPolicy | None = None,
    limits: Limits | None = None,
    on_data_loss: str = "fail",
    force: bool = False,
    lease_s: float = 60.0,
    read: ReadOptions | None = None,
    max_tasks: int | None = None,
) -> TxnStream:
    """Start a run of `job` and register the ``txn_offsets`` streaming source for it in `spark`."""
    _needs_pyarrow()
    if not isinstance(checkpoint_root, str) or not checkpoint_root.strip():
        raise ConfigError(
            "checkpoint_root", "give a directory (any Hadoop path) for the stream's checkpoints"
        )
    if max_tasks is not None and max_tasks <= 0:
        raise ConfigError("max_tasks", f"must be > 0 or None, got {max_tasks}")
    spec = JobSpec.of(
        job=job,
        topics=topics,
        topic_pattern=topic_pattern,
        start=start,
        limits=limits,
        on_data_loss=on_data_loss,
        read=read,
        lease_s=lease_s,
        force=force,
    )
    lifecycle = contextlib.ExitStack()
    _, run = lifecycle.enter_context(job_run(spec, database, kafka))
    config = StreamConfig(
        run=run, kafka=kafka, database=database, spec=spec, tasks=max_tasks or session_cores(spark)
    )
    stream = TxnStream(spark, config, lifecycle, checkpoint_root.rstrip("/"))
    stream.register()
    return stream


def _needs_pyarrow() -> None:
    """Spark's Python data sources hand their rows over as Arrow batches: without pyarrow the
    query's Python worker dies on import and Spark reports only "Python worker failed to connect
    back" after its timeout. Refused here, before a run starts."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError(
            "pyarrow",
            "open_stream needs pyarrow (Spark's Python data sources exchange Arrow batches): install "
            "txn_offsets with its connect extra (README: Install), e.g. pip install "
            "'dist/txn_offsets-0.1.0-py3-none-any.whl[connect]'",
        ) from None


class TxnStream(RunQuery):
    """One run of a job as a Structured Streaming query: its source, its sink, its checkpoint."""

    def __init__(
        self, spark: Any, config: StreamConfig, lifecycle: contextlib.ExitStack, checkpoint_root: str
    ) -> None:
        self.spark = spark
        self.config = config
        self._lifecycle = lifecycle  # the run's (spec.job_run): closing it ends the run
        self._checkpoint_root = checkpoint_root
        self._lease_s = config.spec.lease_s
        self.query: Any = None
        self._closed = False

    @property
    def run(self) -> Run:
        return self.config.run

    @property
    def checkpoint_location(self) -> str:
        """``<checkpoint_root>/<schema>/<job, URL-quoted>/generation-<g>-<run>``: one checkpoint
        per run (the run id's digest tells apart a job re-created with the same generation)."""
        return run_checkpoint(self._checkpoint_root, self.config.database.schema, self.run)

    def register(self) -> None:
        """(Re)register the ``txn_offsets`` format in the session, knowing every open stream."""
        key = session_key(self.spark)
        with _open_lock:
            streams = _open.setdefault(key, {})
            streams[self.run.job] = self.config
            source = bound_source(streams)
        self.spark.dataSource.register(source)

    def records(self) -> Any:
        """``spark.readStream.format("txn_offsets").option("job", <job>).load()``: the stream of
        records (key, value, topic, partition, offset, timestamp, headers)."""
        return self.spark.readStream.format(FORMAT).option("job", self.run.job).load()

    def start(
        self,
        frame: Any = None,
        *,
        write: Callable[[sa.Connection, Sequence[OffsetRange], Any], None],
        compute_df: Callable[[Any], Any] | None = None,
        interval_s: float = 5.0,
        available_now: bool = False,
        isolation_level: str = "READ COMMITTED",
        query_name: str | None = None,
        batch_timeout_s: float | None = 600.0,
    ) -> Any:
        """Start the query: `frame` (default :meth:`records`) written by the exactly-once sink.

        For each batch, ``compute_df(batch_df)`` (default: ``batch_df.collect()``) computes a
        driver-side result, and ``write(conn, ranges, result)`` writes it in the transaction that
        commits the batch's ranges. ``available_now=True`` processes what is in Kafka now (in
        batches capped by the stream's limits) and stops; otherwise a batch every `interval_s`.
        A batch still running after `batch_timeout_s` is cancelled and fails the query.

        `frame` must be this stream's records with stateless transformations only (select,
        filter, withColumn, ...): one read of this job's ``txn_offsets`` source, no other source,
        no streaming state; anything else is refused with a ConfigError.
        """
        if self._closed:
            raise ConfigError("stream", f"the stream of job {self.run.job!r} was closed: open a new one")
        if self.query is not None:
            raise ConfigError("stream", f"the stream of job {self.run.job!r} was already started")
        if not available_now and not 0 <= interval_s < self._lease_s:
            raise ConfigError(
                "interval_s",
                f"{interval_s}s must be >= 0 and shorter than lease_s ({self._lease_s}s): each trigger "
                f"renews the run's lease",
            )
        if batch_timeout_s is not None and not batch_timeout_s > 0:
            raise ConfigError("batch_timeout_s", f"must be > 0 seconds or None, got {batch_timeout_s}")
        frame = self.records() if frame is None else frame
        check_frame(frame, self.run.job)
        sink = ExactlyOnceSink(
            run=self.run,
            database=self.config.database,
            kafka=self.config.kafka,
            write=write,
            compute_df=compute_df,
            isolation_level=isolation_level,
            lease_s=self._lease_s,
            batch_timeout_s=batch_timeout_s,
        )
        writer = frame.writeStream.foreachBatch(sink).option("checkpointLocation", self.checkpoint_location)
        writer = writer.queryName(query_name) if query_name else writer
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(interval_s * 1000)} milliseconds")
        return self._launch(writer, self.run, "stream", self.checkpoint_location)

    def _forget(self) -> None:
        with _open_lock:
            streams = _open.get(session_key(self.spark), {})
            if streams.get(self.run.job) is self.config:  # not a newer stream of the same job
                del streams[self.run.job]


def check_frame(frame: Any, job: str) -> None:
    """Refuse a frame the exactly-once sink cannot commit exactly: not streaming, reading anything
    but one ``txn_offsets`` source of `job` (a union would write records whose ranges this run does
    not commit, or the same records twice), or holding streaming state (it would live in the
    checkpoint, which each run starts afresh)."""
    if not getattr(frame, "isStreaming", False):
        raise ConfigError("frame", "give the streaming DataFrame read from the 'txn_offsets' source")
    analyzed, physical = _plan_sections(frame)
    sources = [line for line in analyzed if _node(line)[0] in ("StreamingRelationV2", "StreamingRelation")]
    option = re.compile(rf"[\[ ]job={re.escape(job)}[,\]]")  # the options map: [job=..., ...]
    ours = [s for s in sources if f", {FORMAT}, " in s and option.search(s)]
    if len(sources) != 1 or len(ours) != 1:
        raise ConfigError(
            "frame",
            f"the stream reads {len(sources)} streaming source(s), {len(ours)} of them job {job!r}'s "
            f"txn_offsets source: the exactly-once sink commits the ranges of exactly one read of its "
            f"own stream (no unions or joins with other streams; use stream.records() once)",
        )
    stateful = sorted(
        {name for name, rest in map(_node, physical) if name in _STATEFUL or "state info [" in rest}
    )
    if stateful:
        raise ConfigError(
            "frame",
            f"the stream holds streaming state ({', '.join(stateful)}): that state would live in the "
            f"checkpoint, which each run starts afresh. Keep the stream stateless and aggregate "
            f"each batch in compute_df, whose result is committed with the batch's offsets",
        )


def _node(line: str) -> tuple[str, str]:
    found = _NODE.match(line)
    return (found.group(1), found.group(2)) if found else ("", "")


def _plan_sections(frame: Any) -> tuple[list[str], list[str]]:
    """The analyzed logical plan's and the physical plan's lines, from ``explain(extended=True)``
    (the same text on classic Spark and Spark Connect)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        frame.explain(extended=True)
    sections: dict[str, list[str]] = {}
    current = ""
    for line in buffer.getvalue().splitlines():
        if line.startswith("== ") and line.endswith(" =="):
            current = line.strip("= ")
            sections[current] = []
        elif current:
            sections[current].append(line)
    return sections.get("Analyzed Logical Plan", []), sections.get("Physical Plan", [])
