"""Exactly-once in Spark's real-time mode: ``open_realtime`` -> Spark's Kafka source -> the row sink.

::

    with open_realtime(spark, job="pageviews", kafka=k, database=db, topics=["pageviews"],
                       checkpoint_root="/var/lib/jobs/checkpoints") as stream:
        query = stream.start(write=upsert_rows, batch_duration="30 seconds")
        query.awaitTermination()

Real-time mode (``trigger(realTime=...)``, Spark >= 4.1) keeps one long-running task per Kafka
partition for each epoch (`batch_duration`) and hands rows to the sink as they arrive. Spark
itself ships no exactly-once sink for it (``foreachBatch`` is not allowed; offsets are
checkpointed once per epoch, so a failure replays up to an epoch of output). Here:

* ``open_realtime`` starts a run of the job (a new generation: it fences every older run, like
  ``run_job``), plans once to seed the offset rows (the start policy, data-loss checks), and reads
  the job's stored offsets: they become the query's ``startingOffsets``. The checkpoint is the
  run's own (``<checkpoint_root>/<schema>/<job>/generation-<g>-<run digest>``, as for
  ``open_stream``), so a new run never resumes an old checkpoint; it starts from the table.
* ``stream.start`` writes the stream with :class:`RealTimeSink`: each partition's rows committed in
  small groups with the partition's offset, guarded like every claim. A query stopped or failed
  can be started again in the same run (the same checkpoint): Spark replays from its last epoch
  and the sink skips the rows the table already has.
* The run's lease is renewed by a thread of the driver while the stream is open.

The source is Spark's own Kafka source (the ``spark-sql-kafka-0-10`` connector on the session's
classpath: :func:`txn_offsets.devstack.spark_kafka.spark_kafka_jars`), reading ``read_committed``
with ``failOnDataLoss``. It uses Kafka's Java client, so properties beyond the bootstrap servers
(TLS, SASL) are given in Java's names with ``kafka_options``. Classic Spark sessions only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, plan_batch
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.spark.stream.realtime_sink import RealTimeSink, RowsWrite
from txn_offsets.spark.stream.running import RunQuery, run_checkpoint
from txn_offsets.store.lease import keep_lease
from txn_offsets.store.offset_rows import load_offsets
from txn_offsets.store.runs import Run

__all__ = ["RealTimeStream", "open_realtime"]

logger = logging.getLogger(__name__)

POSITION = ("topic", "partition", "offset")  # the columns the sink needs in every row
#: the option that marks the Kafka source built by :meth:`RealTimeStream.records` (the Kafka source
#: ignores options it does not know): the query may only read through that source
SOURCE_MARK = "txnOffsetsSource"


def open_realtime(
    spark: Any,
    *,
    job: str,
    kafka: KafkaSettings,
    database: DatabaseSettings,
    checkpoint_root: str,
    topics: Sequence[str],
    start: StartPolicy | None = None,
    on_data_loss: str = "fail",
    force: bool = False,
    lease_s: float = 60.0,
    kafka_options: Mapping[str, str] | None = None,
) -> RealTimeStream:
    """Start a run of `job` for a real-time query over `topics`, from the offsets in the table."""
    if not isinstance(checkpoint_root, str) or not checkpoint_root.strip():
        raise ConfigError("checkpoint_root", "give a directory (any Hadoop path) for the query's checkpoints")
    if kafka.extra and not kafka_options:
        raise ConfigError(
            "kafka_options",
            "Spark's Kafka source uses Kafka's Java client: give the client properties the KafkaSettings "
            "hold (TLS, SASL) in Java's names, e.g. {'security.protocol': 'SASL_SSL', "
            "'sasl.jaas.config': ...}",
        )
    spec = JobSpec.of(
        job=job, topics=topics, start=start, on_data_loss=on_data_loss, lease_s=lease_s, force=force
    )
    lifecycle = contextlib.ExitStack()
    try:
        store, run = lifecycle.enter_context(job_run(spec, database, kafka))
        # seeds the rows of a first run (start policy) and checks the stored offsets against the log
        plan_batch(
            store,
            kafka,
            job=job,
            selection=spec.selection,
            start=spec.start,
            limits=Limits(max_records_per_partition=1),
            on_data_loss=spec.on_data_loss,
            run=run,
        )
        with store.connect() as conn:
            stored = load_offsets(conn, database, job)
        lifecycle.enter_context(keep_lease(store, run, every_s=max(1.0, lease_s / 3)))
    except BaseException:
        lifecycle.close()
        raise
    starting: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(stored.items()):
        if topic in spec.selection.topics:
            starting.setdefault(topic, {})[str(partition)] = offset
    return RealTimeStream(
        spark, run, database, kafka, starting, lifecycle, checkpoint_root.rstrip("/"), kafka_options
    )


class RealTimeStream(RunQuery):
    """One run of a job as a real-time query: its source, its sink, its checkpoint."""

    def __init__(  # noqa: PLR0917 - built by open_realtime only
        self,
        spark: Any,
        run: Run,
        database: DatabaseSettings,
        kafka: KafkaSettings,
        starting: dict[str, dict[str, int]],
        lifecycle: contextlib.ExitStack,
        checkpoint_root: str,
        kafka_options: Mapping[str, str] | None,
    ) -> None:
        self.spark, self.run, self.database, self.kafka = spark, run, database, kafka
        self.starting_offsets = starting  # topic -> partition -> the stored offset at the run's start
        self._lifecycle = lifecycle
        self._kafka_options = dict(kafka_options or {})
        self.checkpoint_location = run_checkpoint(checkpoint_root, database.schema, run)
        self.query: Any = None
        self._closed = False
        self._mark = uuid.uuid4().hex  # this stream's own source, told from any other by this mark

    def records(self) -> Any:
        """Spark's Kafka source from the run's starting offsets: key, value, topic, partition,
        offset, timestamp, timestampType."""
        reader = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
            .option("subscribe", ",".join(self.starting_offsets))
            .option("startingOffsets", json.dumps(self.starting_offsets))
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "true")
            .option(SOURCE_MARK, self._mark)
        )
        for key, value in self._kafka_options.items():
            reader = reader.option(f"kafka.{key}", value)
        return reader.load()

    def start(
        self,
        frame: Any = None,
        *,
        write: RowsWrite,
        batch_duration: str = "30 seconds",
        max_rows: int = 500,
        max_delay_s: float = 0.005,
        isolation_level: str = "READ COMMITTED",
        query_name: str | None = None,
    ) -> Any:
        """Start the real-time query: `frame` (default :meth:`records`, else a stateless
        transformation of it that keeps the topic, partition and offset columns) written by
        :class:`RealTimeSink`, ``write(conn, range, rows)`` per committed group."""
        if self._closed:
            raise ConfigError(
                "stream", f"the real-time stream of job {self.run.job!r} was closed: open a new one"
            )
        if self.query is not None and self.query.isActive:
            raise ConfigError("stream", f"the real-time query of job {self.run.job!r} is running already")
        frame = self.records() if frame is None else frame
        _check_source(frame, self._mark)
        missing = [c for c in POSITION if c not in frame.columns]
        if missing:
            raise ConfigError(
                "frame",
                f"the rows lack the column(s) {', '.join(missing)}: keep Kafka's topic, partition and offset "
                f"columns, the sink commits each row's position",
            )
        sink = RealTimeSink(
            run=self.run,
            database=self.database,
            write=write,
            max_rows=max_rows,
            max_delay_s=max_delay_s,
            isolation_level=isolation_level,
            kafka=self.kafka,
        )
        writer = (
            frame.writeStream.outputMode("update")  # the only output mode real-time mode takes
            .foreach(sink)
            .option("checkpointLocation", self.checkpoint_location)
            .trigger(realTime=batch_duration)
        )
        writer = writer.queryName(query_name) if query_name else writer
        return self._launch(writer, self.run, "real-time query", self.checkpoint_location)


def _check_source(frame: Any, mark: str) -> None:
    """Refuse a frame that reads anything but this stream's own Kafka source (:meth:`records`).

    The sink claims from the STORED offset to each group's last row: a frame read from a source of
    the user's (``spark.readStream.format("kafka")`` starts at ``latest`` by default) would hand it
    rows far above the stored offset, and the claim would count the records in between as done
    without ever having seen them. Every streaming leaf of the frame's analyzed plan must be the
    source records() built (its mark); static leaves (a join with a table) are fine."""
    leaves = frame._jdf.queryExecution().analyzed().collectLeaves()
    # a streaming relation's plan text lists its options: `[..., txnOffsetsSource=<mark>, ...]`
    streaming = [
        str(leaf.simpleString(1000))
        for leaf in (leaves.apply(i) for i in range(leaves.size()))
        if leaf.isStreaming()
    ]
    mine = re.compile(rf"[\[ ]{SOURCE_MARK}={mark}[,\]]")
    ours = [text for text in streaming if mine.search(text)]
    if not ours or len(ours) != len(streaming):
        raise ConfigError(
            "frame",
            "the query must read the job's records through stream.records() (a transformation of it is "
            "fine): it starts at the offsets stored in the table. This frame reads "
            + ("another streaming source" if ours else "no source of this stream")
            + "; a source of your own would start elsewhere (Kafka's default is 'latest') and its first "
            "commit would skip the records in between",
        )
