"""One contender in its own process: ``Worker(spec)`` spawns it, ``worker.run(...)`` times one run.

A worker of a Spark contender starts its own SparkSession (so its first run is a *fresh* process:
cold JVM, no Python workers yet; the session start itself is reported apart) and keeps it for
later runs (*warm*). Every run is checked against the oracle before its numbers are returned; a
wrong result is an error, never a number. A worker can also follow a topic (the latency probe)
until told to stop, time each batch of a job capped by records per batch (``scale``), and sample
its Python workers' memory over many batches (``memory``). Commands and replies are dicts over a
multiprocessing pipe.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from benchmarks import (
    contenders,
    limits,
    lowlatency,
    resources,
    rtm,
    scale_jobs,
    sink,
    sss,
    stream,
    user_scale,
)
from benchmarks import lineage as lineage_phase
from benchmarks.contenders import Context, Outcome
from benchmarks.dataset import Dataset, Expected, expected_of
from benchmarks.resources import Sampler
from benchmarks.settings import (
    COPY,
    EO_BATCH,
    EO_CONNECT,
    EO_FRAME,
    EO_LOW_LATENCY,
    EO_PARTITION,
    EO_STREAM,
    READER,
    READER_SLOTS,
    READERS,
    RTM_ALO,
    SPARK_CONTENDERS,
    SPARK_MASTER,
    SPARK_TASK_SLOTS,
    SSS,
    UPSERT,
    Point,
)
from benchmarks.stats import percentile
from examples import pageviews, windowed_counts
from txn_offsets import BatchReport
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.reader import read_range
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.database import engine_for
from txn_offsets.store.offset_rows import load_offsets

# a worker waiting for its next command this long keeps its Spark Python workers alive (Spark
# stops them after a minute idle); each tiny job costs its JVM and Python workers ~0.5 s of CPU,
# taken from the contender being timed meanwhile, so no more often than needed
KEEP_WARM_S = 45.0


@dataclass(frozen=True)
class Spec:
    contender: str
    db: DatabaseSettings
    kafka: KafkaSettings
    jars: tuple[str, ...]  # spark.jars of every Spark worker (Spark's Kafka connector)
    conf: tuple[tuple[str, str], ...] = ()  # more Spark settings (the scale phase's jobs: FAIR)
    connect: bool = False  # the session also serves Spark Connect, with a client in this process


#: the contenders whose tasks run as Arrow Python work (mapInArrow, a Python data source's reads):
#: another pool of Python workers than the RDD functions'
ARROW_CONTENDERS = (EO_FRAME, EO_CONNECT, EO_STREAM, EO_BATCH)


class Service:
    """The worker side: holds the SparkSession and answers commands."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.spark: Any = None
        self.connect: Any = None  # a Spark Connect session to self.spark's server (Spec.connect)
        self.engine = engine_for(spec.db)
        self.prepared: dict[str, limits.RangeWrites] = {}
        self.following: Any = None
        self.follow_usage: Sampler | None = None
        # keep_warm keeps the Arrow workers' pools too once such a contender ran here, and from the
        # start in the modes phase's session (it serves Spark Connect: every mode runs in it)
        self.arrow_pools = bool(spec.connect)

    def start(self) -> dict[str, Any]:
        if self.spec.contender not in (*SPARK_CONTENDERS, *rtm.FOLLOWERS, EO_LOW_LATENCY):
            return {"startup_s": 0.0, "startup_cpu_s": 0.0}
        from txn_offsets import local_session

        sampler = Sampler()
        t0 = time.perf_counter()
        with sampler as usage:
            conf = {"spark.jars": ",".join(self.spec.jars)} if self.spec.jars else {}
            conf |= dict(self.spec.conf)
            # real-time mode runs a task per partition for a whole epoch: a slot for each
            master = rtm.MASTER if self.spec.contender in rtm.FOLLOWERS else SPARK_MASTER
            self.spark = local_session(
                f"bench-{self.spec.contender}", master=master, conf=conf, serve_connect=self.spec.connect
            )
            if self.spec.connect:
                from txn_offsets.spark.session import connect_client

                self.connect = connect_client(self.spark)
        return {"startup_s": time.perf_counter() - t0, "startup_cpu_s": usage.cpu_s}

    def keep_warm(self) -> dict[str, Any]:
        """A tiny job on every task slot of each pool of Python workers: Spark kills Python workers
        idle for a minute, and a warm run (which a long-running job's batches always are) must find
        them, also after waiting while the contenders interleaved with this one ran. Spark keeps a
        pool per kind of Python work - RDD functions, the classic session's Arrow UDFs (mapInArrow,
        a Python data source's reads), each Spark Connect session's - each idling out on its own
        (until 2026-11-28 only the RDD pool was kept: the DataFrame path's and the stream adapter's
        warm runs started new workers that imported pandas, pyarrow and txn_offsets again)."""
        if self.spark is None or self.following is not None:  # a following job keeps them busy
            return {}
        slots = SPARK_TASK_SLOTS
        self.spark.sparkContext.parallelize(range(slots), slots).mapPartitions(_warm_rdd).count()
        for session in (self.spark, self.connect) if self.arrow_pools else ():  # none to keep yet
            if session is not None:
                session.range(0, slots, 1, slots).mapInArrow(_warm_arrow, "n long").collect()
        return {}

    def context(self, topic: str, partitions: int, cap: int) -> Context:
        return Context(self.spec.db, self.spec.kafka, topic, partitions, cap)

    def run(self, point: Point, data: Dataset, label: str, contender: str | None = None) -> dict[str, Any]:
        name = contender or self.spec.contender  # another contender in this session (the same Spark)
        self.arrow_pools = self.arrow_pools or name in ARROW_CONTENDERS
        ctx = self.context(data.topic, data.partitions, point.cap)
        if name in (UPSERT, COPY) and point.name not in self.prepared:
            self.prepared[point.name] = limits.range_writes(ctx)  # before the clock
        if name not in READERS:
            sink.clear(self.engine, data.topic)
        # the N-process reader's processes start before the clock; it times itself from their go
        slots = limits.ReaderSlots(ctx, SPARK_TASK_SLOTS) if name == READER_SLOTS else None
        try:
            in_memory = None
            timed = None
            t0 = time.perf_counter()
            with Sampler() as usage:
                if name == EO_CONNECT:
                    out = contenders.eo_frame(self.connect, ctx)
                elif name in contenders.RUNNERS:
                    out = contenders.RUNNERS[name](self.spark, ctx)
                elif name == EO_LOW_LATENCY:
                    out = lowlatency.run(self.spark, ctx)
                elif name == SSS:
                    out = sss.run(self.spark, ctx)
                elif name == EO_STREAM:
                    out = stream.run(self.spark, ctx)
                elif name == READER:
                    out, in_memory = limits.reader(ctx)
                elif slots is not None:
                    out, in_memory, timed = slots.run()
                elif name == UPSERT:
                    out = limits.upsert(ctx, self.prepared[point.name])
                else:
                    out = limits.copy_merge(ctx, self.prepared[point.name])
            seconds = time.perf_counter() - t0 if timed is None else timed
        finally:
            if slots is not None:
                slots.close()
        # the check: only a right result has a time
        if in_memory is not None:
            if in_memory != data.expected:
                raise sink.WrongResult(
                    f"{name} on {data.topic}: the in-memory aggregate differs from the oracle"
                )
        else:
            sink.check(self.engine, data.topic, data.expected, name)
        if out.records not in (-1, data.messages):
            raise sink.WrongResult(f"{name} counted {out.records} records, the topic has {data.messages}")
        if name not in READERS:
            sink.clear(self.engine, data.topic)
        numbers = _numbers(out, seconds, usage.peak_rss_mb, usage.cpu_s, data.messages)
        if name in READERS:  # the reader processes actually used (N-process: at most one per partition)
            numbers["processes"] = slots.processes if slots is not None else 1
        return numbers

    def scale(self, data: Dataset, batch_records: int) -> dict[str, Any]:
        """One job over the whole topic, at most `batch_records` per batch; each batch's time
        (from the previous batch's commit to its own: heartbeat + plan + Spark job + commits +
        publish) and the part of it that was the Spark job with its per-range transactions."""
        ctx = self.context(data.topic, data.partitions, 0)
        sink.clear(self.engine, data.topic)
        t0 = time.perf_counter()
        out = contenders.per_batch(self.spark, ctx, job=contenders._job("scale"), batch_records=batch_records)
        seconds = time.perf_counter() - t0
        sink.check(self.engine, data.topic, data.expected, f"scale p{data.partitions}")
        if out.records != data.messages:
            raise sink.WrongResult(f"scale counted {out.records} records, the topic has {data.messages}")
        sink.clear(self.engine, data.topic)
        # the first batch also holds run_job's start (preflight, run registration): left out
        batches = [
            {
                "interval_s": b - a,
                "job_s": report.seconds,
                "outside_s": max(0.0, b - a - report.seconds),
                "ranges": report.ranges,
                "records": report.records,
            }
            for a, b, report in zip(out.commits, out.commits[1:], out.reports[1:], strict=False)
        ]
        return {"seconds": seconds, "records": out.records, "batches": batches}

    def user(self, data: user_scale.SpreadTopic, batch_records: int) -> dict[str, Any]:
        """The README-shaped job (benchmarks.user_scale: per-range ``write``) over a spread topic."""
        user_scale.create_table(self.engine)
        return user_scale.run(self.spark, self.spec.db, self.spec.kafka, data, batch_records=batch_records)

    def jobs(self, datasets: list[Dataset], batch_records: int, mode: str, app: str) -> dict[str, Any]:
        """N jobs on threads of this session vs one job over their topics (benchmarks.scale_jobs)."""
        return scale_jobs.run(self.spark, self.spec.db, self.spec.kafka, datasets, batch_records, mode, app)

    def memory(self, data: Dataset, batch_records: int, batches: int, every: int) -> dict[str, Any]:
        """One job of `batches` small batches; the RSS of the Spark Python workers (and of the
        daemon, the JVM and the driver) after batch 1 and every `every` batches."""
        ctx = self.context(data.topic, data.partitions, 0)
        sink.clear(self.engine, data.topic)
        samples: list[dict[str, Any]] = []

        def sample(report: BatchReport) -> None:
            if report.number == 1 or report.number % every == 0 or report.number == batches:
                now = resources.roles()
                samples.append(
                    {
                        "batch": report.number,
                        "workers": len(now.workers_mb),
                        "workers_mb": now.workers_total_mb,
                        "worker_max_mb": max(now.workers_mb.values(), default=0.0),
                        "worker_pids": sorted(now.workers_mb),
                        "daemon_mb": now.daemon_mb,
                        "jvm_mb": now.jvm_mb,
                        "driver_mb": now.driver_mb,
                    }
                )

        job = contenders._job("memory")
        t0 = time.perf_counter()
        out = contenders.per_batch(
            self.spark, ctx, job=job, batch_records=batch_records, max_batches=batches, on_batch=sample
        )
        seconds = time.perf_counter() - t0
        # the check: the result rows equal the oracle of exactly the offsets the job committed
        with self.engine.connect() as conn:
            stored = load_offsets(conn, self.spec.db, job)
        sink.check(self.engine, data.topic, _expected_before(ctx, stored), "memory")
        sink.clear(self.engine, data.topic)
        return {"seconds": seconds, "records": out.records, "batches": len(out.commits), "samples": samples}

    def follow(self, topic: str, partitions: int, cap: int, interval_s: float) -> dict[str, Any]:
        ctx = self.context(topic, partitions, cap)
        self.follow_usage = Sampler()
        self.follow_usage.__enter__()
        if self.spec.contender == EO_PARTITION:
            stop = threading.Event()
            self.following = (stop, contenders.follow_eo(self.spark, ctx, stop, interval_s))
        elif self.spec.contender == EO_LOW_LATENCY:
            stop = threading.Event()
            self.following = (stop, lowlatency.follow(self.spark, ctx, stop))
        elif self.spec.contender == SSS:
            self.following = sss.Follower(self.spark, ctx, interval_s)
        elif self.spec.contender in rtm.FOLLOWERS:
            self.following = rtm.Follower(self.spark, ctx, alo=self.spec.contender == RTM_ALO)
        else:
            raise ValueError(f"{self.spec.contender} cannot follow a topic")
        return {}

    def unfollow(self) -> dict[str, Any]:
        if isinstance(self.following, sss.Follower | rtm.Follower):
            self.following.stop()
        elif self.following is not None:
            stop, thread = self.following
            stop.set()
            thread.join(120)
        self.following = None
        assert self.follow_usage is not None
        self.follow_usage.__exit__(None, None, None)
        usage = self.follow_usage.usage
        return {"peak_rss_mb": usage.peak_rss_mb, "cpu_s": usage.cpu_s}

    def close(self) -> None:
        if self.connect is not None:
            self.connect.stop()
        if self.spark is not None:
            self.spark.stop()
        self.engine.dispose()


def _warm_rdd(items: Any) -> Any:
    """A Python worker's part of keep_warm: what the contenders' tasks import, imported."""
    import txn_offsets.spark.writers  # noqa: F401  (and with it the reader, the commit core, SQLAlchemy)

    return [sum(1 for _ in items)]


def _warm_arrow(batches: Any) -> Any:
    import pyarrow as pa

    import txn_offsets.spark.writers  # noqa: F401

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], names=["n"])


def _expected_before(ctx: Context, stored: dict[tuple[str, int], int]) -> Expected:
    """The oracle of the records before the stored offsets, read back from Kafka."""
    ranges = [OffsetRange(t, p, 0, end) for (t, p), end in sorted(stored.items()) if t == ctx.topic]
    records = (rec for rng in ranges for rec in read_range(ctx.kafka, rng))
    return expected_of(windowed_counts.aggregate(pageviews.decode(r) for r in records))


def _numbers(out: Outcome, seconds: float, rss_mb: float, cpu_s: float, records: int) -> dict[str, Any]:
    batches = out.batch_seconds()
    return {
        "seconds": seconds,
        "records": records,
        "records_per_s": records / seconds if seconds > 0 else None,
        "batches": len(batches),
        "batch_p50_s": percentile(batches, 50),
        "batch_p99_s": percentile(batches, 99),
        "peak_rss_mb": rss_mb,
        "cpu_s": cpu_s,
        "cpu_s_per_1k": cpu_s / records * 1000 if records else None,
    }


def serve(conn: Connection, spec: Spec) -> None:
    """The worker process: start, then answer commands until "exit"."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    service = Service(spec)
    try:
        conn.send(_answer(service.start))
        while True:
            while not conn.poll(KEEP_WARM_S):
                service.keep_warm()
            cmd = conn.recv()
            op = cmd.pop("op")
            if op == "exit":
                break
            handler = {
                "run": service.run,
                "warm": service.keep_warm,
                "scale": service.scale,
                "user": service.user,
                "memory": service.memory,
                "jobs": service.jobs,
                "follow": service.follow,
                "unfollow": service.unfollow,
                "lineage": lambda **c: lineage_phase.timed_run(service, **c),
            }[op]
            conn.send(_answer(lambda h=handler, c=cmd: h(**c)))
    finally:
        service.close()
        conn.send({"ok": True})


def _answer(call: Any) -> dict[str, Any]:
    try:
        return {"ok": True, **call()}
    except Exception as exc:
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "kind": type(exc).__name__,
            "trace": traceback.format_exc()[-3000:],
        }


class WorkerFailed(Exception):
    """The worker did not answer, or answered with an error: `kind` is its exception's class name."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


class Worker:
    """The orchestrator's handle on one worker process."""

    def __init__(self, spec: Spec, timeout_s: float = 600.0) -> None:
        self.spec = spec
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=serve, args=(child, spec), name=f"bench-{spec.contender}", daemon=True
        )
        self._proc.start()
        child.close()
        self.hello = self._reply(timeout_s)

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                raise WorkerFailed(
                    f"{self.spec.contender}: the worker process exited ({self._proc.exitcode})"
                )
            if time.monotonic() > deadline:
                raise WorkerFailed(f"{self.spec.contender}: no answer within {timeout_s:.0f}s")
        answer: dict[str, Any] = self._conn.recv()
        if not answer.pop("ok"):
            raise WorkerFailed(
                f"{self.spec.contender}: {answer['error']}\n{answer.get('trace', '')}", answer.get("kind", "")
            )
        return answer

    def call(self, op: str, timeout_s: float = 3600.0, **args: Any) -> dict[str, Any]:
        self._conn.send({"op": op, **args})
        return self._reply(timeout_s)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send({"op": "exit"})
                self._reply(120)
            except (WorkerFailed, OSError, EOFError):
                pass
            self._proc.join(30)
        if self._proc.is_alive() and self._proc.pid is not None:
            os.kill(self._proc.pid, 9)
            self._proc.join(10)
