"""The limits txn_offsets is measured against, without Spark.

* reader limit (1 process) - one Python process consumes the whole topic (all partitions,
  read_committed) with confluent-kafka as fast as it can, decodes with examples/pageviews.decode
  and aggregates with examples/windowed_counts.aggregate (the per-task work of the PartitionWriter,
  minus Spark and the database). Its result is checked against the oracle in memory.
* reader limit (N processes) - the same loop in N = SPARK_TASK_SLOTS processes (the Spark
  contenders' task slots: the same parallelism on the same machine), the topic's partitions split
  round-robin over them (at most one process per partition), their aggregates merged and checked
  against the oracle. The processes are started (interpreter, imports) before the clock; the clock
  runs from the moment all of them are ready and told to go until the last one's result is merged.
  They are subprocesses, not multiprocessing children: the bench worker that runs them is a
  daemonic multiprocessing process, which may not have any.
* write limit - the partial aggregates each range of the point would write (ranges of ``cap``
  offsets per partition, computed before the clock starts) written one transaction per range on
  one connection: with ``upsert_add`` (what txn_offsets writes) and with COPY + merge.

The raw loop (:func:`scan`) is an independent confluent-kafka loop, not txn_offsets' reader; it
reads the way txn_offsets.kafka.reader does (take what librdkafka has fetched, wait only for the
first message when it has nothing; the same ``fetch.wait.max.ms``), so that the limit differs from
the reader by what the reader does per record, not by how long it waits.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from benchmarks import sink
from benchmarks.contenders import Context, Outcome
from benchmarks.dataset import Expected, expected_of
from examples import pageviews, windowed_counts
from txn_offsets.kafka.records import Record
from txn_offsets.store.database import engine_for

Partials = windowed_counts.Partials
# one range's (records, partial aggregates), in the order txn_offsets' batches would commit them
RangeWrites = list[tuple[int, Partials]]

BATCH_MESSAGES = 10_000  # the most one consume() returns
FIRST_WAIT_S = 0.2  # how long consume() waits for the first message when nothing is fetched yet
REPO = Path(__file__).resolve().parent.parent


def scan(
    ctx: Context, partitions: Iterable[int] | None = None, stall_s: float = 120.0
) -> Iterator[list[Message]]:
    """Every visible record of the topic's `partitions` (default: all), in the consumer's batches,
    until each partition's end."""
    wanted = list(range(ctx.partitions)) if partitions is None else list(partitions)
    consumer = Consumer(
        {
            **ctx.kafka.client_config(),
            "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # the value txn_offsets' reader uses (txn_offsets.kafka.consumers.consumer_config), so that
            # both wait the same on the broker: a fetch at the log's end waits this long for data
            # (the default is 500 ms); 0 would spin fetches while a batch is decoded
            "fetch.wait.max.ms": 2,
        }
    )
    consume = consumer.consume
    try:
        # the topic's leaders first (one metadata round trip, a few ms): a partition assigned at
        # OFFSET_BEGINNING before librdkafka knows its leader retries its offset query on a 500 ms
        # timer - the first record came 0.5 s after the start, half the time of a 40,000-record
        # topic (txn_offsets' pooled consumers start at known offsets with metadata at hand)
        consumer.list_topics(ctx.topic, timeout=30)
        consumer.assign([TopicPartition(ctx.topic, p, OFFSET_BEGINNING) for p in wanted])
        done: set[int] = set()
        last = time.monotonic()
        while len(done) < len(wanted):
            # what librdkafka has already fetched, without waiting; only when that is nothing, wait
            # for the first message or event. Never wait for a full batch: consume(n, timeout)
            # returns when it has n messages or at the timeout, so consume(10_000, 0.05) idled up
            # to 50 ms each time fewer than 10,000 records were queued.
            batch = consume(BATCH_MESSAGES, 0)
            if not batch:
                batch = consume(1, FIRST_WAIT_S)
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


def _read(ctx: Context, partitions: Iterable[int] | None = None) -> tuple[Outcome, Partials]:
    """The reader limit's loop: consume + decode + aggregate `partitions` (default: all)."""
    out = Outcome()
    totals: Partials = {}
    for batch in scan(ctx, partitions):
        _merge(totals, windowed_counts.aggregate(pageviews.decode(_record(m)) for m in batch))
        out.committed(len(batch))
    return out, totals


def _merge(totals: Partials, partials: Partials) -> None:
    for key, (views, duration) in partials.items():
        acc = totals.setdefault(key, [0, 0])
        acc[0] += views
        acc[1] += duration


def reader(ctx: Context) -> tuple[Outcome, Expected]:
    out, totals = _read(ctx)
    return out, expected_of(totals)


class ReaderSlots:
    """The N-process reader limit of one run. Construct it before the clock: it starts
    min(slots, partitions) processes (partition p goes to process p % slots) and returns once each
    has imported everything and is waiting; :meth:`run` lets them go and times them. Always
    :meth:`close` it."""

    def __init__(self, ctx: Context, slots: int) -> None:
        shares = [[p for p in range(ctx.partitions) if p % slots == i] for i in range(slots)]
        self.shares = [share for share in shares if share]
        self.procs: list[subprocess.Popen[bytes]] = []
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        try:
            for share in self.shares:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from benchmarks.limits import slot_main; slot_main()"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=REPO,
                    env=env,
                )
                self.procs.append(proc)
                _send(proc, (ctx, share))
            for proc in self.procs:
                # a process that cannot start ends its stdout (EOFError) or reports its error
                _receive(proc, "ready")
        except BaseException:
            self.close()
            raise

    @property
    def processes(self) -> int:
        return len(self.procs)

    def run(self) -> tuple[Outcome, Expected, float]:
        """Go: every process reads its partitions; the merged result, and the seconds from the go
        to the last result merged."""
        out = Outcome()
        started = out.started
        for proc in self.procs:
            _send(proc, "go")
        totals: Partials = {}
        for proc in self.procs:
            records, commits, partials = _receive(proc, "done")
            _merge(totals, partials)
            out.records += records
            out.commits.extend(commits)
        seconds = time.perf_counter() - started
        out.commits.sort()  # perf_counter is CLOCK_MONOTONIC: one clock for all processes
        for proc in self.procs:
            proc.wait(60)
        return out, expected_of(totals), seconds

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def _send(proc: subprocess.Popen[bytes], message: Any) -> None:
    assert proc.stdin is not None
    pickle.dump(message, proc.stdin)
    proc.stdin.flush()


def _load(stream: IO[bytes]) -> Any:
    return pickle.load(stream)  # noqa: S301 - between the bench worker and its own subprocesses


def _receive(proc: subprocess.Popen[bytes], expected: str) -> Any:
    assert proc.stdout is not None
    try:
        kind, payload = _load(proc.stdout)
    except EOFError:
        raise RuntimeError(f"bench reader slot {proc.pid} exited ({proc.wait(10)})") from None
    if kind != expected:
        raise RuntimeError(f"bench reader slot {proc.pid}: {payload}")
    return payload


def slot_main() -> None:
    """One process of :class:`ReaderSlots`: (ctx, partitions) on stdin, "ready" on stdout, waits
    for "go", reads, answers (records, batch commit times, partials); pickles both ways."""
    out: IO[bytes] = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers

    def answer(kind: str, payload: Any) -> None:
        pickle.dump((kind, payload), out)
        out.flush()

    try:
        ctx, partitions = _load(sys.stdin.buffer)
        answer("ready", None)
        if _load(sys.stdin.buffer) != "go":
            return
        result, totals = _read(ctx, partitions)
        answer("done", (result.records, result.commits, totals))
    except Exception as exc:
        answer("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")


def range_writes(ctx: Context) -> RangeWrites:
    """What the PartitionWriter writes for this point, about: the partials of each [k*cap, (k+1)*cap)
    (a range of the point's average size; its batches share cap x partitions by backlog)."""
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
