"""The Spark contenders that use txn_offsets' reader: exactly once per partition (on the RDD and on
the DataFrame execution path), per batch, and the at-least-once baseline. Each reads one topic from
its start to its end in the point's batches (:attr:`Context.limits`), aggregates page views per
(1-minute window, page) and adds them into the result table; each returns the records it counted
and the time each batch's results committed. :func:`per_batch` is the PartitionWriter job capped by
a given number of records per batch (shared evenly), for the scale and memory phases.

The SSS contender is in :mod:`benchmarks.sss`, the limits in :mod:`benchmarks.limits`.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.alo import UnguardedTask
from examples import pageviews, windowed_counts
from txn_offsets import BatchReport, BatchWriter, Limits, StartPolicy, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange, plan_ranges
from txn_offsets.spark.batch import Batch
from txn_offsets.spark.tasks import TaskReport
from txn_offsets.store.runs import Run


@dataclass(frozen=True)
class Context:
    """What one run needs: where to read and write, and the batch cap."""

    db: DatabaseSettings  # the run's offsets schema
    kafka: KafkaSettings
    topic: str
    partitions: int
    cap: int  # records per partition per batch, on average

    @property
    def batch_offsets(self) -> int:
        return self.cap * self.partitions

    @property
    def limits(self) -> Limits:
        """The batches every contender reads: at most `batch_offsets` offsets, shared over the
        partitions in proportion to their backlog - SSS's ``maxOffsetsPerTrigger`` of the same
        value splits a batch the same way, so on a skewed topic both read alike batches."""
        return Limits(max_records_per_batch=self.batch_offsets, batch_share="backlog")


@dataclass
class Outcome:
    records: int = 0
    started: float = field(default_factory=time.perf_counter)
    commits: list[float] = field(default_factory=list)  # perf_counter() when each batch committed
    reports: list[BatchReport] = field(default_factory=list)  # run_job's, when kept (per_batch)

    def committed(self, records: int = 0) -> None:
        self.commits.append(time.perf_counter())
        self.records += records

    def batch_seconds(self) -> list[float]:
        """Each batch's share of the wall time: from the previous commit (or the start) to its own."""
        marks = [self.started, *self.commits]
        return [b - a for a, b in itertools.pairwise(marks)]


def _job(name: str) -> str:
    return f"bench-{name}-{uuid.uuid4().hex[:8]}"


def eo_partition(spark: Any, ctx: Context, execution: str = "rdd") -> Outcome:
    """examples/windowed_counts.py as it is: PartitionWriter, claim + upsert + offset per range."""
    out = Outcome()
    summary = run_job(
        spark,
        job=_job("partition" if execution == "rdd" else "frame"),
        kafka=ctx.kafka,
        database=ctx.db,
        writer=windowed_counts.WRITER,
        topics=[ctx.topic],
        start=StartPolicy.earliest(),
        limits=ctx.limits,
        until_caught_up=True,
        on_batch=lambda report: out.committed(report.records),
        execution=execution,
    )
    _same(summary.records, out.records, f"eo_partition ({execution})")
    return out


def eo_frame(spark: Any, ctx: Context) -> Outcome:
    """The same job on the DataFrame execution path (spark.range + mapInArrow, no RDD API: what
    runs under Spark Connect), forced on this classic session."""
    return eo_partition(spark, ctx, execution="dataframe")


def per_batch(
    spark: Any,
    ctx: Context,
    *,
    job: str,
    batch_records: int,
    max_batches: int | None = None,
    on_batch: Callable[[BatchReport], None] | None = None,
) -> Outcome:
    """eo_partition capped by records per batch (``max_records_per_batch``: the same total at any
    partition count, like SSS's maxOffsetsPerTrigger), keeping run_job's report of each batch."""
    out = Outcome()

    def committed(report: BatchReport) -> None:
        out.committed(report.records)
        out.reports.append(report)
        if on_batch is not None:
            on_batch(report)

    summary = run_job(
        spark,
        job=job,
        kafka=ctx.kafka,
        database=ctx.db,
        writer=windowed_counts.WRITER,
        topics=[ctx.topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=batch_records),
        until_caught_up=True,  # or max_batches, whichever comes first
        max_batches=max_batches,
        batch_interval_s=0.0,
        on_batch=committed,
    )
    _same(summary.records, out.records, "per_batch")
    return out


def _aggregate_partition(records: Iterator[Record]) -> Iterator[tuple[tuple[int, str], list[int]]]:
    return iter(windowed_counts.aggregate(pageviews.decode(r) for r in records).items())


def _merge(a: list[int], b: list[int]) -> list[int]:
    return [a[0] + b[0], a[1] + b[1]]


def compute_partials(records: Any) -> windowed_counts.Partials:
    """Spark over the batch's RDD[Record]: partial aggregates per range, reduced across ranges."""
    parallelism = records.context.defaultParallelism
    return dict(records.mapPartitions(_aggregate_partition).reduceByKey(_merge, parallelism).collect())


def _write_batch(
    conn: sa.Connection, ranges: Sequence[OffsetRange], partials: windowed_counts.Partials
) -> None:
    if ranges:
        sink.write_upsert(conn, ranges[0].topic, partials)


def merge_partials(records: Any) -> windowed_counts.Partials:
    """The same partial aggregates in one stage: each Spark partition's collected, merged on the
    driver (the same work as a PartitionWriter's batch, whose ranges' partials PostgreSQL merges)."""
    merged: windowed_counts.Partials = {}
    for key, counts in records.mapPartitions(_aggregate_partition).collect():
        found = merged.get(key)
        merged[key] = counts if found is None else _merge(found, counts)
    return merged


BATCH_WRITER: BatchWriter[windowed_counts.Partials] = BatchWriter(
    compute=compute_partials, write=_write_batch
)
MERGING_BATCH_WRITER: BatchWriter[windowed_counts.Partials] = BatchWriter(
    compute=merge_partials, write=_write_batch
)


def eo_batch(spark: Any, ctx: Context) -> Outcome:
    """BatchWriter: Spark computes over the whole batch (a shuffle: reduceByKey), the driver
    commits all ranges at once."""
    return _batch_writer(spark, ctx, BATCH_WRITER, "batch")


def eo_batch_merged(spark: Any, ctx: Context) -> Outcome:
    """BatchWriter whose compute is one stage (partials merged on the driver): the mode's own cost,
    without the shuffle eo_batch's compute pays."""
    return _batch_writer(spark, ctx, MERGING_BATCH_WRITER, "batch-merged")


def _batch_writer(
    spark: Any, ctx: Context, writer: BatchWriter[windowed_counts.Partials], name: str
) -> Outcome:
    out = Outcome()
    run_job(
        spark,
        job=_job(name),
        kafka=ctx.kafka,
        database=ctx.db,
        writer=writer,
        topics=[ctx.topic],
        start=StartPolicy.earliest(),
        limits=ctx.limits,
        until_caught_up=True,
        on_batch=lambda _report: out.committed(),
    )
    # a BatchWriter reports the offsets it committed (compute saw the batch whole; the page views'
    # aborted transactions and markers among them): the oracle check that follows every run is
    # what proves the records were all counted, once
    out.records = -1
    return out


def _unguarded(batch: Batch) -> list[TaskReport]:
    """PartitionWriter.commit without the guard: the same tasks and transactions, no claim."""
    task = UnguardedTask(
        database=batch.database,
        kafka=batch.kafka,
        run=batch.run,
        ranges=batch.ranges,
        prepare=windowed_counts.WRITER.prepare,
        write=windowed_counts.WRITER.write_ranges,
        read=batch.read,
    )
    reports: list[TaskReport] = batch.ranges_rdd().mapPartitionsWithIndex(task).collect()
    return reports


def alo(spark: Any, ctx: Context) -> Outcome:
    """The same job with the guard off (at-least-once): the same ranges, tasks, reads and writes,
    planned from offsets kept in this process only (nothing claims or stores them, so a crash
    between a range's commit and the driver's bookkeeping would count the range twice)."""
    out = Outcome()
    run = Run(job=_job("alo"), generation=0, run_id=uuid.uuid4().hex)
    parts = [(ctx.topic, p) for p in range(ctx.partitions)]
    ends = {tp: end for tp, (_, end) in watermarks(ctx.kafka, parts).items()}
    position = dict.fromkeys(ends, 0)
    number = 0
    while True:
        ranges = plan_ranges(position, ends, max_total=ctx.batch_offsets, share=ctx.limits.batch_share)
        if not ranges:
            return out
        number += 1
        reports = _unguarded(Batch(number, tuple(ranges), spark, ctx.db, ctx.kafka, run))
        for report in reports:
            if report.error is not None:
                raise report.error
        out.committed(sum(r.records for r in reports))
        position.update({r.key: r.until for r in ranges})


def follow_eo(spark: Any, ctx: Context, stop: threading.Event, interval_s: float) -> threading.Thread:
    """run_job following the topic (caught-up latency probe) until `stop` is set."""
    return follow_thread(spark, ctx, stop, "follow", limits=ctx.limits, batch_interval_s=interval_s)


def follow_thread(
    spark: Any, ctx: Context, stop: threading.Event, label: str, **options: Any
) -> threading.Thread:
    """A started daemon thread running run_job over the topic from its start until `stop` is set
    (windowed counts, a job named after `label`), with run_job's `options` on top."""
    thread = threading.Thread(
        target=run_job,
        kwargs={
            "spark": spark,
            "job": _job(label),
            "kafka": ctx.kafka,
            "database": ctx.db,
            "writer": windowed_counts.WRITER,
            "topics": [ctx.topic],
            "start": StartPolicy.earliest(),
            "stop": stop,
            **options,
        },
        name=f"bench-{label}",
        daemon=True,
    )
    thread.start()
    return thread


def _same(reported: int, counted: int, name: str) -> None:
    if reported != counted:
        raise sink.WrongResult(f"{name}: the summary says {reported} records, the batches {counted}")


RUNNERS: dict[str, Callable[[Any, Context], Outcome]] = {
    "eo_partition": eo_partition,
    "eo_frame": eo_frame,
    "eo_batch": eo_batch,
    "eo_batch_merged": eo_batch_merged,
    "alo": alo,
}
