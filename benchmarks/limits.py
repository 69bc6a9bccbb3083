"""The limits txn_offsets is measured against, without Spark.

* reader limit - one Python process consumes the whole topic (all partitions, read_committed) with
  confluent-kafka as fast as it can, decodes with examples/pageviews.decode and aggregates with
  examples/windowed_counts.aggregate (the per-task work of the PartitionWriter, minus Spark and the
  database). Its result is checked against the oracle in memory.
* write limit - the partial aggregates each range of the point would write (ranges of ``cap``
  offsets per partition, computed before the clock starts) written one transaction per range on
  one connection: with ``upsert_add`` (what txn_offsets writes) and with COPY + merge.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from benchmarks import sink
from benchmarks.contenders import Context, Outcome
from benchmarks.dataset import Expected, expected_of
from examples import pageviews, windowed_counts
from txn_offsets.kafka.reader import Record
from txn_offsets.store.database import engine_for

Partials = windowed_counts.Partials
# one range's (records, partial aggregates), in the order txn_offsets' batches would commit them
RangeWrites = list[tuple[int, Partials]]


def scan(ctx: Context, stall_s: float = 120.0) -> Iterator[list[Message]]:
    """Every visible record of the topic, in the consumer's batches, until each partition's end."""
    consumer = Consumer(
        {
            **ctx.kafka.client_config(),
            "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # as fast as it can: do not let the broker hold the last (empty) fetch for 500 ms
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        consumer.assign([TopicPartition(ctx.topic, p, OFFSET_BEGINNING) for p in range(ctx.partitions)])
        done: set[int] = set()
        last = time.monotonic()
        while len(done) < ctx.partitions:
            # a short timeout: consume() waits for all num_messages (or the timeout) even at the end
            batch = consumer.consume(num_messages=10_000, timeout=0.05)
            records = []
            for msg in batch:
                err = msg.error()
                if err is None:
                    records.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition() or 0)
                else:
                    raise RuntimeError(f"bench reader: {err.name()}: {err.str()}")
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > stall_s:
                raise RuntimeError(f"bench reader: no progress on {ctx.topic} for {stall_s:.0f}s")
            if records:
                yield records
    finally:
        consumer.close()


def _record(msg: Message) -> Record:
    return Record(msg.topic() or "", msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value(), None)


def reader(ctx: Context) -> tuple[Outcome, Expected]:
    out = Outcome()
    totals: Partials = {}
    for batch in scan(ctx):
        partials = windowed_counts.aggregate(pageviews.decode(_record(m)) for m in batch)
        for key, (views, duration) in partials.items():
            acc = totals.setdefault(key, [0, 0])
            acc[0] += views
            acc[1] += duration
        out.committed(len(batch))
    return out, expected_of(totals)


def range_writes(ctx: Context) -> RangeWrites:
    """What the PartitionWriter writes for this point: the partials of each [k*cap, (k+1)*cap)."""
    buckets: dict[tuple[int, int], list[Record]] = {}
    for batch in scan(ctx):
        for msg in batch:
            rec = _record(msg)
            buckets.setdefault((rec.offset // ctx.cap, rec.partition), []).append(rec)
    return [
        (len(records), windowed_counts.aggregate(pageviews.decode(r) for r in records))
        for _, records in sorted(buckets.items())
    ]


def _writes(write: Callable[..., None]) -> Callable[[Context, RangeWrites], Outcome]:
    def run(ctx: Context, ranges: RangeWrites) -> Outcome:
        out = Outcome()
        engine = engine_for(ctx.db)
        try:
            for records, partials in ranges:
                with engine.begin() as conn:
                    write(conn, ctx.topic, partials)
                out.committed(records)
        finally:
            engine.dispose()
        return out

    return run


upsert = _writes(sink.write_upsert)
copy_merge = _writes(sink.write_copy)
