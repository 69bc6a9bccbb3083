"""``spark.readStream.format("txn_offsets")``: a Structured Streaming source planned from the offset table.

A Python data source (pyspark.sql.datasource, Spark >= 4.2 for read limits). Its stream reader runs
on the Spark driver (on the Connect server under Spark Connect) and plans each micro-batch with the
same planner as ``run_job``: from the offsets stored in PostgreSQL, capped by :class:`Limits`, with
the same data-loss checks. The table is the truth, Spark's checkpoint only follows it:

* the checkpoint is per run generation (:mod:`txn_offsets.spark.stream.query`), so a (re)started
  query has no checkpoint and Spark asks :meth:`initialOffset`, which reads the table: an offset
  reset made while the query was stopped is honoured;
* every trigger renews the run's lease and raises Fenced once a newer run (or a reset) took the job;
* a planned batch is stored in ``stream_plans`` for the exactly-once sink, which commits exactly
  those ranges with the batch's results (:mod:`txn_offsets.store.stream_plans`): one reader (one
  query) owns a run's stream, and it plans past a batch only once that batch is committed (a
  stream written by another sink would otherwise re-read the same records forever).

A Spark offset is ``{"generation": g, "next": {topic: {partition: offset}}, "batch": [[topic,
partition, start, until, topic_id], ...]}``: the positions after the batch, and the batch's ranges
with the Kafka topic id each was planned from.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, StreamDiverged, TopicMissing, TxnOffsetsError
from txn_offsets.plan.planner import Limits, plan_batch
from txn_offsets.ranges import OffsetRange, TopicPartition
from txn_offsets.spark.batch import assign_ranges
from txn_offsets.spark.frames import arrow_batches, record_schema
from txn_offsets.spark.spec import JobSpec
from txn_offsets.spark.tasks import ReadTask
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.offset_rows import load_offsets
from txn_offsets.store.runs import Run, heartbeat
from txn_offsets.store.stream_plans import become_reader, check_committed, range_rows, ranges_of, save_plan

__all__ = ["FORMAT", "StreamConfig", "TxnOffsetsSource", "bound_source"]

logger = logging.getLogger(__name__)

FORMAT = "txn_offsets"
# how long a stream waits (no new batch) for a topic that went missing to exist again
TOPIC_MISSING_GRACE_S = 30.0
# how long a stream waits (no new batch) while planning finds Kafka unreachable or a partition's
# leader moving (a broker died: its partitions' new leaders are elected in seconds); run_job retries
# the same ServiceUnavailable from the stored offsets
UNAVAILABLE_GRACE_S = 60.0


@dataclass(frozen=True)
class StreamConfig:
    """What the source of one job's stream needs (picklable: it travels to the Spark driver)."""

    run: Run
    kafka: KafkaSettings
    database: DatabaseSettings
    spec: JobSpec  # topics, start, limits, data-loss policy, read options
    tasks: int = 2  # at most this many Spark tasks (input partitions) per batch


def bound_source(configs: Mapping[str, StreamConfig]) -> type[TxnOffsetsSource]:
    """A subclass of :class:`TxnOffsetsSource` that knows the streams of `configs` (job -> config),
    to register with ``spark.dataSource.register``. Settings travel in the class, never in the
    query's options (which Spark shows in plans and its UI)."""
    return type("TxnOffsetsBoundSource", (TxnOffsetsSource,), {"streams": dict(configs)})


class TxnOffsetsSource(DataSource):
    """The ``txn_offsets`` format; option ``job`` picks the stream (opened with
    :func:`txn_offsets.open_stream`)."""

    streams: ClassVar[dict[str, StreamConfig]] = {}

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        return record_schema()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        job = self.options.get("job")
        if job is None or job not in self.streams:
            known = ", ".join(repr(j) for j in sorted(self.streams)) or "none"
            raise ConfigError(
                "job",
                f"readStream.format('txn_offsets') needs .option('job', <name>) naming a stream opened "
                f"with txn_offsets.open_stream in this session (open: {known}); got {job!r}",
            )
        return StreamReader(self.streams[job])


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from the offset table (on the driver) and reads their ranges (in tasks)."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.reader_id = uuid.uuid4().hex  # this query's reader: the one owner of the run's plans
        self._store: Store | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow
        self._waiting: dict[str, float] = {}  # why planning gives no batch (a topic missing...): since
        # the batch this reader last stored (save_plan): partitions() of that same batch, which Spark
        # asks right after latestOffset planned it, need not store it again (a round trip a batch)
        self._saved: tuple[OffsetRange, ...] | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(
                engine_for(self.config.database, pool_size=1, max_overflow=1), self.config.database
            )
        return self._store

    # -- driver side ---------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        cfg = self.config
        heartbeat(self.store, cfg.run)
        # a second query over the same stream fails here, not after replacing the first's batch
        become_reader(self.store, cfg.run, self.reader_id)
        with self.store.connect() as conn:
            stored = load_offsets(conn, cfg.database, cfg.run.job)
        return {"generation": cfg.run.generation, "next": _nested(stored), "batch": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.config.spec.limits.max_records_per_batch
        return ReadAllAvailable() if cap is None else ReadMaxRows(cap)

    def prepareForTriggerAvailableNow(self) -> None:
        # the data there is now: the end offsets of a plan without caps
        plan = self._plan(Limits())
        self._target = dict(plan.ends)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        cfg = self.config
        previous = _ranges(start)
        if previous:  # the batch Spark considers done must be committed before planning past it
            self._check_generation(start)
            check_committed(self.store, cfg.run, self.reader_id, previous)
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        try:  # the plan renews the run's lease (Fenced if a newer run or a reset took the job)
            # without a batch cap there is nothing to share (Limits refuses "backlog" alone)
            share = cfg.spec.limits.batch_share if cap is not None else "even"
            plan = self._plan(replace(cfg.spec.limits, max_records_per_batch=cap, batch_share=share))
        except TopicMissing as exc:
            return self._while_missing(exc, start)
        except ServiceUnavailable as exc:
            return self._while_unavailable(exc, start)
        self._waiting.clear()
        ranges = self._clip(plan.ranges)
        if not ranges:
            return start
        positions = _flat(start.get("next", {}))
        positions.update({r.key: r.until for r in ranges})
        save_plan(self.store, cfg.run, self.reader_id, ranges)
        self._saved = ranges
        return {
            "generation": cfg.run.generation,
            "next": _nested(positions),
            "batch": range_rows(ranges),
        }

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = _ranges(end) if end != start else ()
        if not ranges:
            return []
        self._check_generation(end)
        # stored again: a batch Spark replays from its checkpoint is not planned by latestOffset
        # (this reader stored nothing yet, or another batch)
        if ranges != self._saved:
            save_plan(self.store, self.config.run, self.reader_id, ranges)
            self._saved = ranges
        groups = assign_ranges([r.span for r in ranges], max(1, min(len(ranges), self.config.tasks)))
        return [InputPartition(tuple(ranges[i] for i in group)) for group in groups]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the exactly-once sink committed the batch's ranges with its results."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.engine.dispose()
            self._store = None

    # -- tasks ---------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        ranges: tuple[OffsetRange, ...] = partition.value
        task = ReadTask(self.config.kafka, ranges, self.config.spec.read)
        return arrow_batches(task(0, [tuple(range(len(ranges)))]), self.config.spec.read.batch_size)

    # -- helpers -------------------------------------------------------------------------------

    def _while_missing(self, exc: TopicMissing, start: dict[str, Any]) -> dict[str, Any]:
        """A topic of the stream is gone: no new batch for up to TOPIC_MISSING_GRACE_S, so that a
        topic deleted and created again (which Kafka does in two steps, some time apart) reaches the
        next plan, where the new topic id is data loss as always (``on_data_loss``)."""
        note = f"topic {exc.topic!r} does not exist (being re-created?)"
        return self._no_batch("missing", exc, start, TOPIC_MISSING_GRACE_S, note)

    def _while_unavailable(self, exc: ServiceUnavailable, start: dict[str, Any]) -> dict[str, Any]:
        """Planning found Kafka unreachable or a partition's leader moving (a broker died): no new
        batch for up to UNAVAILABLE_GRACE_S, as run_job plans again after it."""
        return self._no_batch("unavailable", exc, start, UNAVAILABLE_GRACE_S, str(exc))

    def _no_batch(
        self, why: str, exc: TxnOffsetsError, start: dict[str, Any], grace_s: float, note: str
    ) -> dict[str, Any]:
        """No new batch (the query stays up; the next trigger plans again) while `why` lasts, for up to
        `grace_s`; for longer, the query fails with `exc`. Nothing was planned: nothing is skipped."""
        heartbeat(self.store, self.config.run)  # no plan renewed the lease meanwhile
        now = time.monotonic()
        since = self._waiting.setdefault(why, now)
        if since == now:
            logger.warning("job %r: %s; no new batch for up to %gs", self.config.run.job, note, grace_s)
        if now - since > grace_s:
            raise exc
        return start

    def _plan(self, limits: Limits) -> Any:
        cfg = self.config
        return plan_batch(
            self.store,
            cfg.kafka,
            job=cfg.run.job,
            selection=cfg.spec.selection,
            start=cfg.spec.start,
            limits=limits,
            on_data_loss=cfg.spec.on_data_loss,
            run=cfg.run,
        )

    def _clip(self, ranges: Sequence[OffsetRange]) -> tuple[OffsetRange, ...]:
        """Under Trigger.AvailableNow, nothing past the offsets there were when the query started."""
        if self._target is None:
            return tuple(ranges)
        out = []
        for r in ranges:
            until = min(r.until, self._target.get(r.key, r.start))
            if until > r.start:
                out.append(replace(r, until=until))
        return tuple(out)

    def _check_generation(self, offset: Mapping[str, Any]) -> None:
        gen = self.config.run.generation
        if offset.get("generation") != gen:
            raise StreamDiverged(
                self.config.run.job,
                gen,
                f"the checkpoint holds a batch of generation {offset.get('generation')!r}: a "
                f"checkpoint belongs to one run (open_stream derives a new location per generation)",
            )


def _ranges(offset: Mapping[str, Any]) -> tuple[OffsetRange, ...]:
    return ranges_of(offset.get("batch", ()))


def _nested(positions: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, part), off in sorted(positions.items()):
        out.setdefault(topic, {})[str(part)] = int(off)
    return out


def _flat(nested: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {(topic, int(part)): int(off) for topic, parts in nested.items() for part, off in parts.items()}
