"""The txn_offsets Structured Streaming adapter as a contender: ``readStream.format("txn_offsets")``
(planned from the offset table, the point's batch cap shared by backlog) written by the exactly-once
sink, ``trigger(availableNow=True)``. ``compute_df`` is the SSS peer's DataFrame aggregation
(:func:`benchmarks.sss.window_counts`); the write is the same additive upsert, committed with the
batch's ranges in one transaction. Its checkpoint is a fresh temporary directory per run (each run
is a new job, so a new generation in any case).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.contenders import Context, Outcome, _job
from benchmarks.sss import window_counts
from txn_offsets import StartPolicy
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.query import open_stream


def partials_of(batch: Any) -> sink.Partials:
    """The micro-batch's page views and durations per (window, page), collected to the driver."""
    return {(int(r.w), str(r.p)): [int(r.views), int(r.duration_ms)] for r in window_counts(batch).collect()}


def run(spark: Any, ctx: Context) -> Outcome:
    """Read the topic to its end in the point's batches (``ctx.limits``), exactly once."""
    out = Outcome()
    checkpoints = tempfile.mkdtemp(prefix="bench-stream-")

    # foreachBatch runs in this (the driver's) process on classic Spark: the closure sees `out`
    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], partials: sink.Partials) -> None:
        sink.write_upsert(conn, ctx.topic, partials)
        out.committed(sum(views for views, _ in partials.values()))

    try:
        with open_stream(
            spark,
            job=_job("stream"),
            kafka=ctx.kafka,
            database=ctx.db,
            topics=[ctx.topic],
            start=StartPolicy.earliest(),
            limits=ctx.limits,
            checkpoint_root=checkpoints,
        ) as stream:
            query = stream.start(compute_df=partials_of, write=write, available_now=True)
            query.awaitTermination()
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    return out
