"""The peer: Spark Structured Streaming with Spark's own (JVM) Kafka source.

``spark.readStream.format("kafka")`` with ``kafka.isolation.level=read_committed``,
``startingOffsets=earliest`` and ``maxOffsetsPerTrigger`` = cap x partitions (the same batch cap as
txn_offsets', shared over partitions in proportion to their backlog on both sides);
``foreachBatch`` computes the same aggregation with DataFrame operations (``from_json``,
``window(..., "1 minute")``, count and sum per page), collects the rows and adds them into the same
table with the same upsert, in one transaction per micro-batch.
Its checkpoint is a fresh temporary directory per run; its database writes are at-least-once.

The connector comes from :func:`txn_offsets.devstack.spark_kafka.spark_kafka_jars`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.contenders import Context, Outcome
from txn_offsets.store.database import engine_for

VALUE_SCHEMA = "u STRING, p STRING, t BIGINT, d BIGINT"  # examples/pageviews.py's JSON


def source(spark: Any, ctx: Context, max_offsets: int | None) -> Any:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", ctx.kafka.bootstrap_servers)
        .option("subscribe", ctx.topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load()


def window_counts(df: Any) -> Any:
    """Page views and durations per (1-minute event-time window, page) of a micro-batch."""
    from pyspark.sql import functions as F

    views = df.select(F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v")).select("v.*")
    return (
        views.groupBy(F.window(F.timestamp_millis(F.col("t")), "1 minute").alias("w"), F.col("p"))
        .agg(F.count(F.lit(1)).alias("views"), F.sum("d").alias("duration_ms"))
        .select(F.unix_millis(F.col("w.start")).alias("w"), "p", "views", "duration_ms")
    )


def _each_batch(engine: sa.Engine, topic: str, out: Outcome) -> Callable[[Any, int], None]:
    def each(df: Any, _batch_id: int) -> None:
        rows = window_counts(df).collect()
        partials = {(int(r.w), str(r.p)): [int(r.views), int(r.duration_ms)] for r in rows}
        with engine.begin() as conn:
            sink.write_upsert(conn, topic, partials)
        out.committed(sum(views for views, _ in partials.values()))

    return each


def run(spark: Any, ctx: Context) -> Outcome:
    """Read the topic to its end (``trigger(availableNow=True)``) in batches of cap x partitions."""
    out = Outcome()
    engine = engine_for(ctx.db)
    checkpoint = tempfile.mkdtemp(prefix="bench-sss-")
    try:
        query = (
            source(spark, ctx, ctx.batch_offsets)
            .writeStream.foreachBatch(_each_batch(engine, ctx.topic, out))
            .trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        query.awaitTermination()
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
        engine.dispose()
    return out


class Follower:
    """SSS following a topic with ``trigger(processingTime=interval)`` until :meth:`stop`."""

    def __init__(self, spark: Any, ctx: Context, interval_s: float) -> None:
        self.out = Outcome()
        self._engine = engine_for(ctx.db)
        self._checkpoint = tempfile.mkdtemp(prefix="bench-sss-follow-")
        self._query = (
            source(spark, ctx, ctx.batch_offsets)
            .writeStream.foreachBatch(_each_batch(self._engine, ctx.topic, self.out))
            .trigger(processingTime=f"{interval_s} seconds")
            .option("checkpointLocation", self._checkpoint)
            .start()
        )

    def stop(self) -> None:
        try:
            self._query.stop()
            error = self._query.exception()
            if error is not None:
                raise RuntimeError(f"the SSS query failed: {error}")
        finally:
            shutil.rmtree(self._checkpoint, ignore_errors=True)
            self._engine.dispose()
