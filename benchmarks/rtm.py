"""Spark's real-time mode (``trigger(realTime=...)``) as latency followers.

Both read the topic with Spark's Kafka source from the offsets of a fresh job
(:func:`txn_offsets.spark.stream.realtime.open_realtime`) and hand every row to a ``foreach``
writer in long-running tasks: ``rtm_eo`` is the exactly-once row sink
(:class:`txn_offsets.spark.stream.realtime_sink.RealTimeSink`: each partition's rows committed in
small groups with its offset, guarded); ``rtm_alo`` is the same writer with the same groups but
without the claim (:class:`benchmarks.alo.UnguardedRealTimeSink`: at-least-once, what Spark's own
documentation and the usual real-time-mode demos into PostgreSQL do). Each group's page views are
aggregated per (window, page) and added with the same upsert as every other contender.

Real-time mode keeps one task per Kafka partition running for a whole epoch, so the session needs
a task slot per partition (:data:`MASTER`); pyspark's ``foreach`` hands rows to the Python writer
in batches (see docs/benchmarks.md, "Real-time mode"), which the latency shows.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.alo import UnguardedRealTimeSink
from benchmarks.contenders import Context, _job
from benchmarks.settings import LATENCY_PARTITIONS, RTM_FOLLOWERS
from examples.pageviews import decode, window_of
from txn_offsets import StartPolicy
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.realtime import open_realtime

FOLLOWERS = RTM_FOLLOWERS
MASTER = f"local[{LATENCY_PARTITIONS}]"  # the latency phase's topic: a task slot per partition
EPOCH = "30 seconds"  # Spark's batch duration: an offsets checkpoint per epoch


def partials_of(rows: Sequence[Any]) -> sink.Partials:
    """A group's page views per (1-minute window, page), from the raw Kafka rows."""
    out: dict[tuple[int, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        view = decode(SimpleNamespace(value=bytes(row["value"])))  # type: ignore[arg-type]
        acc = out[(window_of(view.time_ms), view.page)]
        acc[0] += 1
        acc[1] += view.duration_ms
    return dict(out)


def _write(topic: str, conn: sa.Connection, rng: OffsetRange, rows: Sequence[Any]) -> None:
    sink.write_upsert(conn, topic, partials_of(rows))


class Follower:
    """A real-time query following ``ctx.topic`` until :meth:`stop` (exactly once unless `alo`)."""

    def __init__(self, spark: Any, ctx: Context, *, alo: bool) -> None:
        import functools

        self._checkpoints = tempfile.mkdtemp(prefix="bench-rtm-")
        self._stream = open_realtime(
            spark,
            job=_job("rtm"),
            kafka=ctx.kafka,
            database=ctx.db,
            topics=[ctx.topic],
            start=StartPolicy.earliest(),
            checkpoint_root=self._checkpoints,
        )
        write = functools.partial(_write, ctx.topic)
        if alo:
            writer = UnguardedRealTimeSink(
                run=self._stream.run, database=ctx.db, kafka=ctx.kafka, write=write
            )
            self._query = (
                self._stream.records()
                .writeStream.outputMode("update")
                .foreach(writer)
                .option("checkpointLocation", self._stream.checkpoint_location)
                .trigger(realTime=EPOCH)
                .start()
            )
        else:
            self._query = self._stream.start(write=write, batch_duration=EPOCH)

    def stop(self) -> None:
        try:
            error = self._query.exception()
            self._stream.close()
            if error is not None:
                raise RuntimeError(f"the real-time query failed: {error}")
        finally:
            shutil.rmtree(self._checkpoints, ignore_errors=True)
