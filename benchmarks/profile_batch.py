"""Where a small batch's time goes, without Spark: the driver's per-batch work (heartbeat, plan with
its Kafka lookups) and each range's work as a task does it (read + decode + aggregate, then the
transaction: claim + upsert + offset), timed piece by piece, in one process, one range at a time.

    python -m benchmarks.profile_batch                          # 8 and 128 partitions, 8,000 records/batch
    python -m benchmarks.profile_batch --partitions 128 --profile   # + cProfile of the range work

Compare with the scale phase of ``make bench`` (the same batches on Spark, two task slots): what
Spark adds is its per-batch time minus (driver work + range work / slots).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import io
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from benchmarks.dataset import delete_topics, produce_dataset
from examples import migrate as examples_migrate
from examples import windowed_counts
from txn_offsets import StartPolicy, from_env
from txn_offsets.config import DatabaseSettings
from txn_offsets.kafka import metadata
from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
from txn_offsets.spark import tasks
from txn_offsets.spark.tasks import PartitionTask
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import end_run, heartbeat, start_run

_spent: collections.defaultdict[str, float] = collections.defaultdict(float)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[name] += time.perf_counter() - t0

    return wrapper


def _patch() -> None:
    """Time the pieces where they are looked up (module attributes)."""
    metadata.describe_topics = _timed("plan: describe_topics (Kafka)", metadata.describe_topics)
    metadata.watermarks = _timed("plan: watermarks (Kafka)", metadata.watermarks)
    tasks.commit_reporting = _timed("range: transaction", tasks.commit_reporting)
    # the task module's own name for it (where the tasks look it up); not an export of tasks
    reads = "range: read (until each range's records are at hand)"
    tasks.read_in_order = _timed_steps(reads, tasks.read_in_order)  # type: ignore[attr-defined]


def _timed_steps(name: str, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """`fn`'s iterator, the time to produce each item counted (not the caller's time between them)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        inner = fn(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(inner)
            except StopIteration:
                return
            finally:
                _spent[name] += time.perf_counter() - t0
            yield item

    return wrapper


def one_topic(  # noqa: PLR0917 - a script's one call
    db: DatabaseSettings,
    kafka: Any,
    partitions: int,
    messages: int,
    per_batch: int,
    batches: int,
    profile: bool,
    sort: str = "tottime",
) -> None:
    data = produce_dataset(kafka, partitions, messages)
    print(f"\n{partitions} partitions: {data.messages:,} records in {data.topic}", flush=True)
    engine = engine_for(db)
    job = f"profile-{uuid.uuid4().hex[:8]}"
    run = start_run(Store(engine, db), job)
    selection = TopicSelection((data.topic,), None)
    per_batch_s: list[float] = []
    ranges_n: list[int] = []
    prof = cProfile.Profile() if profile else None
    try:
        for number in range(batches + 1):
            t0 = time.perf_counter()
            with _span("driver: heartbeat"):
                heartbeat(Store(engine, db), run)
            with _span("driver: plan (total)"):
                plan = plan_batch(
                    Store(engine, db),
                    kafka,
                    job=job,
                    selection=selection,
                    start=StartPolicy.earliest(),
                    limits=Limits(max_records_per_batch=per_batch),
                    generation=run.generation,
                )
            if not plan.ranges:
                break
            task = PartitionTask(
                database=db,
                kafka=kafka,
                run=run,
                ranges=plan.ranges,
                prepare=windowed_counts.WRITER.prepare,
                write=windowed_counts.WRITER.write_ranges,
            )
            if prof is not None and number > 0:
                prof.enable()
            with _span("range: all (read + decode + aggregate + transaction)"):
                for report in task(0, [tuple(range(len(plan.ranges)))]):
                    if report.error is not None:
                        raise report.error
            if prof is not None:
                prof.disable()
            if number == 0:  # connections, pools, imports: not counted
                _spent.clear()
                continue
            per_batch_s.append(time.perf_counter() - t0)
            ranges_n.append(len(plan.ranges))
    finally:
        end_run(Store(engine, db), run)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM txn_examples.window_counts WHERE topic = '{data.topic}'"))  # noqa: S608
        engine.dispose()
        delete_topics(kafka, [data.topic])
    n = len(per_batch_s)
    print(
        f"batches timed {n}, ranges/batch {statistics.median(ranges_n):.0f}, one process, one range at a "
        f"time: per batch median {statistics.median(per_batch_s) * 1000:.1f} ms"
    )
    ranges_total = sum(ranges_n)
    for name, seconds in sorted(_spent.items()):
        per = f"{seconds / ranges_total * 1000:7.2f} ms/range" if name.startswith("range") else ""
        print(f"  {name:58} {seconds / n * 1000:8.1f} ms/batch {per}")
    _spent.clear()
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(30)
        print(out.getvalue())


class _span:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        _spent[self.name] += time.perf_counter() - self.t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--partitions", default="8,128")
    parser.add_argument("--batch-records", type=int, default=8_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="cProfile the range work")
    parser.add_argument("--sort", default="tottime", help="pstats order: tottime | cumulative")
    args = parser.parse_args(argv)
    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=f"bench_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(db)
    examples_migrate.upgrade(db)
    _patch()
    try:
        for partitions in (int(p) for p in args.partitions.split(",")):
            messages = args.batch_records * (args.batches + 2)
            one_topic(
                db, kafka, partitions, messages, args.batch_records, args.batches, args.profile, args.sort
            )
    finally:
        engine = engine_for(db)
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{db.schema}" CASCADE'))
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
