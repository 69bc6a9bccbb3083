"""``make bench``: what exactly-once costs, measured against its peers on the same data in the same run.

Every contender reads the same pre-produced page-view topic(s) (examples/pageviews.py: skewed
users and pages, every 10th Kafka transaction aborted), computes the same aggregation (views and
duration per 1-minute window and page, examples/windowed_counts.py) into the same result table,
and is checked against the oracle before its time counts (a wrong result exits non-zero):

* ``eo_partition``  txn_offsets run_job + PartitionWriter (claim + upsert + offset per range)
* ``eo_frame``      the same on the DataFrame execution path (run_job(execution="dataframe"))
* ``eo_stream``     the Structured Streaming adapter: readStream.format("txn_offsets") + the
                    exactly-once foreachBatch sink, the same aggregation as ``sss`` (availableNow)
* ``eo_batch``      txn_offsets run_job + BatchWriter (Spark computes, one transaction per batch)
* ``alo``           the same reads and writes without claim or offsets (at-least-once)
* ``sss``           Spark Structured Streaming, Spark's JVM Kafka source, foreachBatch upsert
* ``reader``        one Python process consuming + decoding the topic (the reader limit)
* ``reader_slots``  the same in as many processes as the Spark session has task slots (local[2]:
                    2), the topic's partitions split round-robin (the per-slot reader limit)
* ``upsert`` / ``copy_merge``  the result rows of each range written with upsert_add vs COPY + merge

swept over batch caps x partitions, each contender in a fresh process (first run: *fresh*) and
again in the same SparkSession (*warm*; the best warm run counts, and the contenders of the
headline ratios run ``headline_warm_runs`` warm runs at the headline points, see settings.py; the
warm runs of a point's contenders interleave, see :func:`schedule`),
plus a caught-up latency probe. Two more phases: *scale* times each batch of eo_partition at the
same records per batch on topics of 8 and 128 partitions (alternating runs in one session),
*memory* samples the Spark Python workers' RSS over one job of many small batches (500 in full).
Output: a table, JSON under benchmarks/results/, a PNG, and (``--docs``, default for full)
docs/benchmarks.md. The line before last is ``bench: per_batch_128_vs_8=..
workers_rss_growth_mb=.. workers_rss_growth_pct=.. reader_vs_raw_1proc_per_slot=..``, the last
``bench: eo_vs_sss_small=.. eo_vs_sss_large=.. eo_vs_alo=.. reader_vs_raw=.. writes_vs_copy=..``
(txn_offsets' warm records/s over the peer's; reader_vs_raw: over the per-slot reader limit on the
large headline point's topic - the same parallelism on the same machine -, and
reader_vs_raw_1proc_per_slot: over task slots x the 1-process limit). Sizes:
BENCH_SIZE=smoke|full; knobs in settings.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import (
    latency,
    lineage,
    lowlatency,
    machine,
    modes,
    partial,
    plot,
    report,
    scale,
    sink,
    user_scale,
)
from benchmarks.dataset import Dataset, delete_topics, produce_dataset
from benchmarks.settings import (
    COPY,
    EO_PARTITION,
    FOLLOWERS,
    FRESH,
    FULL,
    LATENCY,
    LATENCY_PARTITIONS,
    LINEAGE,
    MEMORY,
    MODES,
    READERS,
    RTM_FOLLOWERS,
    SCALE,
    SPARK_CONTENDERS,
    SPARK_MASTER,
    SPARK_TASK_SLOTS,
    SWEEP,
    UPSERT,
    WARM,
    Point,
    Size,
    size_from_env,
)
from benchmarks.worker import Spec, Worker, WorkerFailed
from examples import migrate as examples_migrate
from txn_offsets import from_env
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.devstack.spark_kafka import spark_kafka_jars
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "benchmarks.md"
FOLLOW_INTERVAL_S = latency.FOLLOW_INTERVAL_S


def say(text: str) -> None:
    print(f"bench: {text}", flush=True)


class Bench:
    def __init__(self, size: Size, db: DatabaseSettings, kafka: KafkaSettings, jars: tuple[str, ...]) -> None:
        self.size, self.db, self.kafka, self.jars = size, db, kafka, jars
        self.engine = engine_for(db)
        self.points = size.points()
        self.datasets: dict[tuple[int, int, bool], Dataset] = {}
        self.runs: list[dict[str, Any]] = []
        self.latency: list[dict[str, Any]] = []
        self.latency_phase_runs: list[dict[str, Any]] = []
        self.throughput_runs: list[dict[str, Any]] = []
        self.scale_runs: list[dict[str, Any]] = []
        self.memory: dict[str, Any] = {}
        self.scale_more: dict[str, Any] = {}
        self.scale_user: list[dict[str, Any]] = []
        self.lineage: dict[str, Any] = {}
        self.modes: dict[str, Any] = {}
        # the reader limits run once per topic, not per point
        self.swept = tuple(c for c in (*SPARK_CONTENDERS, UPSERT, COPY) if c in size.contenders)
        self.readers_run = tuple(c for c in READERS if c in size.contenders)
        self.headline_points = {size.headline(size.small_cap), size.headline(size.large_cap)}
        self.followers = tuple(c for c in FOLLOWERS if c in size.contenders)

    def spec(self, contender: str, *, connect: bool = False) -> Spec:
        spark = contender in SPARK_CONTENDERS or contender in RTM_FOLLOWERS
        return Spec(contender, self.db, self.kafka, self.jars if spark else (), connect=connect)

    def produce(self) -> None:
        if SWEEP in self.size.phases or MODES in self.size.phases:
            for key in sorted({(p.partitions, p.messages) for p in self.points}):
                self.topic(*key)

    def topic(self, partitions: int, messages: int, *, spread: bool = False) -> Dataset:
        """The topic of `messages` page views over `partitions` (produced on first use); `spread`:
        round-robin over every partition (the scale phase's), else in each user's partition."""
        key = (partitions, messages, spread)
        if key not in self.datasets:
            data = produce_dataset(self.kafka, partitions, messages, spread=spread)
            self.datasets[key] = data
            say(
                f"produced {data.messages:,} page views (+{data.aborted:,} aborted) to {data.topic} "
                f"({key[0]} partitions) in {data.produce_seconds:.1f}s"
            )
        return self.datasets[key]

    def dataset(self, point: Point) -> Dataset:
        return self.datasets[(point.partitions, point.messages, False)]

    def measure(self, worker: Worker, point: Point, label: str, round_: int) -> None:
        data = self.dataset(point)
        numbers = worker.call("run", point=point, data=data, label=label)
        run = {
            "contender": worker.spec.contender,
            "point": point.name,
            "partitions": point.partitions,
            "cap": point.cap,
            "messages": data.messages,
            "topic": data.topic,
            "label": label,
            "round": round_,
            "startup_s": worker.hello["startup_s"] if label == FRESH else None,
            **numbers,
        }
        self.runs.append(run)
        say(
            f"{point.name:12} {worker.spec.contender:12} {label:5} {run['seconds']:7.2f}s "
            f"{run['records_per_s']:>10,.0f} rec/s  batches {run['batches']:4d} "
            f"p50/p99 {run['batch_p50_s']:.2f}/{run['batch_p99_s']:.2f}s  "
            f"rss {run['peak_rss_mb']:6,.0f} MB  cpu {run['cpu_s_per_1k']:.3f} s/1k"
            + (f"  (session start {run['startup_s']:.1f}s)" if run["startup_s"] else "")
            + (f"  processes {run['processes']}" if "processes" in run else "")
        )

    def sweep(self) -> None:
        """Fresh + warm runs of each contender at each point, the contenders' order rotated.

        With a process per point, all the point's contenders (and the reader limits, at the
        largest cap of each topic) are alive together and their warm runs interleave, each round
        in a different order: a drift of the machine (the page cache, autovacuum, a busier core)
        then weighs on every contender alike instead of on whichever ran first."""
        for round_ in range(self.size.repeat):
            if self.size.process_per_point:
                # the reader limits, once per topic: beside the contenders of its largest cap
                reader_at = {self.dataset(p).topic: p for p in sorted(self.points, key=lambda p: p.cap)}
                for i, point in enumerate(self.points):
                    readers = self.readers_run if reader_at[self.dataset(point).topic] == point else ()
                    self.interleaved(point, _rotated((*self.swept, *readers), round_ + i), round_)
            else:  # one worker per contender: only its first point has a fresh run
                for contender in _rotated(self.swept, round_):
                    worker = Worker(self.spec(contender))
                    try:
                        for i, point in enumerate(self.points):
                            if i == 0:
                                self.measure(worker, point, FRESH, round_)
                            for _ in range(self.warm_runs(contender, point)):
                                self.measure(worker, point, WARM, round_)
                        if round_ == 0 and contender in self.followers:
                            self.follow(worker)
                    finally:
                        worker.close()
                for contender in _rotated(self.readers_run, round_) if self.readers_run else ():
                    self.readers(contender, round_)
        if self.size.process_per_point:
            for contender in self.followers:
                worker = Worker(self.spec(contender))
                try:
                    self.follow(worker)
                finally:
                    worker.close()

    def interleaved(self, point: Point, order: list[str], round_: int) -> None:
        """The point's contenders in worker processes alive together, run by `schedule`."""
        workers: dict[str, Worker] = {}
        wanted = {c: self.warm_runs(c, point) for c in order}
        try:
            for contender, label in schedule(order, wanted):
                if contender not in workers:
                    workers[contender] = Worker(self.spec(contender))
                self.measure(workers[contender], point, label, round_)
        finally:
            for worker in workers.values():
                worker.close()

    def warm_runs(self, contender: str, point: Point) -> int:
        if contender in READERS:  # on the large headline point's topic: as many as the headline ones
            large = self.dataset(self.size.headline(self.size.large_cap)).topic
            return self.size.warm_runs_of(contender, self.dataset(point).topic == large)
        return self.size.warm_runs_of(contender, point in self.headline_points)

    def readers(self, contender: str, round_: int) -> None:
        """A reader limit, once per topic (a fresh process, then warm); on the large headline
        point's topic as many warm runs as the headline contenders there."""
        worker = Worker(self.spec(contender))
        try:
            seen = set()
            for point in self.points:
                topic = self.dataset(point).topic
                if topic in seen:
                    continue
                seen.add(topic)
                self.measure(worker, point, FRESH, round_)
                for _ in range(self.warm_runs(contender, point)):
                    self.measure(worker, point, WARM, round_)
        finally:
            worker.close()

    def follow(self, worker: Worker) -> None:
        partitions = self.size.headline_partitions
        probe = latency.probe(
            worker,
            self.kafka,
            self.engine,
            partitions=partitions,
            cap=self.size.large_cap,
            rate=self.size.latency_rate,
            seconds=self.size.latency_seconds,
            interval_s=FOLLOW_INTERVAL_S,
        )
        probe["contender"] = worker.spec.contender
        self.latency.append(probe)
        say(
            f"latency {worker.spec.contender:12} {probe['records']:,} records in {probe['producer_batches']} "
            f"transactions at {probe['rate']:,}/s: p50 {probe['p50_ms']:.0f} ms, "
            f"p99 {probe['p99_ms']:.0f} ms, max {probe['max_ms']:.0f} ms"
        )

    def latency_phase(self) -> None:
        """Every latency follower at LATENCY_RATE over LATENCY_PARTITIONS (latency.phase), then the
        low-latency mode's throughput beside batch mode's at the large cap."""
        self.latency_phase_runs = latency.phase(
            self.spec, self.kafka, self.engine, cap=self.size.large_cap, seconds=self.size.latency_seconds
        )
        self.low_latency_throughput()

    def low_latency_throughput(self) -> None:
        """The low-latency mode and batch mode (eo_partition) over the same topic of `messages`
        records on LATENCY_PARTITIONS at the large cap, in ONE worker (the same SparkSession),
        alternating (lowlatency.order); every run checked against the oracle (Service.run)."""
        data = self.topic(LATENCY_PARTITIONS, self.size.messages)
        point = Point(LATENCY_PARTITIONS, self.size.large_cap, data.messages)
        worker = Worker(self.spec(EO_PARTITION))
        try:
            for i, (contender, label) in enumerate(lowlatency.order(self.size.low_latency_runs)):
                numbers = worker.call("run", point=point, data=data, label=label, contender=contender)
                run = {"contender": contender, "label": label, "order": i, "topic": data.topic, **numbers}
                self.throughput_runs.append(run)
                say(
                    f"throughput {point.name} {contender:14} {label:5} {numbers['seconds']:7.2f}s "
                    f"{numbers['records_per_s']:>10,.0f} rec/s  batches/epochs {numbers['batches']:3d}  "
                    f"cpu {numbers['cpu_s_per_1k']:.3f} s/1k"
                )
        finally:
            worker.close()

    def scale(self) -> None:
        """eo_partition at the same records per batch on two partition counts: one session, a
        first run of each, then `scale_runs` rounds in alternating order (ABBA...)."""
        a, b = self.size.scale_partitions
        per_batch = self.size.scale_batch_records
        # about 25 batches per run (the sweep's topics when they have that size)
        messages = min(self.size.messages, per_batch * 25)
        # records round-robin over every partition: each batch at N partitions carries ~min(N,
        # per_batch) ranges (a page-view topic, keyed by a skewed user, fills a few hundred of 4,096)
        data = {p: self.topic(p, messages, spread=True) for p in (a, b)}
        more = self.size.scale_more  # thousands of partitions: fewer batches (scale.py)
        data |= {
            p: self.topic(p, per_batch * more.many_batches, spread=True) for p in more.many if p not in data
        }
        counts = list(data)
        order = list(counts)
        for round_ in range(self.size.scale_runs):
            order += counts[::-1] if round_ % 2 == 0 else counts
        # FAIR and application_name for the many jobs run in this same (warm) session afterwards
        spec, app = scale.worker_spec(self.db, self.kafka, self.jars)
        worker = Worker(spec)
        try:
            seen: set[int] = set()
            for i, partitions in enumerate(order):
                numbers = worker.call("scale", data=data[partitions], batch_records=per_batch)
                label = WARM if partitions in seen else "first"
                seen.add(partitions)
                run: dict[str, Any] = {
                    "partitions": partitions,
                    "label": label,
                    "order": i,
                    "batch_records": per_batch,
                }
                run |= {"topic": data[partitions].topic, "messages": data[partitions].messages, **numbers}
                self.scale_runs.append(run)
                one = report.scale_stats(run["batches"])
                say(
                    f"scale p{partitions:<4} {label:5} {numbers['seconds']:7.2f}s batches "
                    f"{len(numbers['batches']) + 1:3d} ranges/batch {one['ranges_p50']:.0f} per-batch p50 "
                    f"{one['interval_p50_s']:.3f}s (job {one['job_p50_s']:.3f}s, outside "
                    f"{one['outside_p50_s']:.3f}s) p99 {one['interval_p99_s']:.3f}s"
                )
            self.scale_user = self.user_scale(worker, per_batch, (a, max(more.many, default=b)))
            self.scale_more = scale.measure(self.size, self.db, self.kafka, worker, app=app, topics=data)
        finally:
            worker.close()

    def user_scale(self, worker: Worker, per_batch: int, counts: tuple[int, int]) -> list[dict[str, Any]]:
        """The README-shaped job (benchmarks/user_scale.py: per-range ``write`` of an upsert, decode
        -> 1, aggregate = sum) at `per_batch` records per batch on topics spread over `counts`
        partitions: a first run of each (round 0), then ``user_rounds`` rounds alternating (ABBA...),
        each run labelled with its round (scale.user_ratio: the median of the rounds' ratios)."""
        records = per_batch * self.size.scale_more.many_batches
        topics = {n: user_scale.produce_spread(self.kafka, n, records) for n in counts}
        order = [(0, n) for n in counts]
        for round_ in range(self.size.scale_more.user_rounds):
            order += [(round_ + 1, n) for n in (counts[::-1] if round_ % 2 == 0 else counts)]
        runs: list[dict[str, Any]] = []
        try:
            for i, (round_, n) in enumerate(order):
                run = worker.call("user", data=topics[n], batch_records=per_batch)
                run |= {"order": i, "round": round_, "label": WARM if round_ else "first"}
                runs.append(run)
                say(
                    f"scale user p{n:<4} {run['label']:5} {run['seconds']:7.2f}s batches {run['batches']:3d} "
                    f"ranges/batch {run['ranges_p50']:.0f} per-batch p50 {run['interval_p50_s']:.3f}s "
                    f"(job {run['job_p50_s']:.3f}s); {user_scale.costs_line(run)}"
                )
        finally:
            delete_topics(self.kafka, [t.topic for t in topics.values()])
        return runs

    def memory_phase(self) -> None:
        """One job of many small batches in a fresh worker; its Python workers' RSS over time."""
        size = self.size
        data = self.topic(size.headline_partitions, size.messages)
        # enough batches in the topic (aborted records and markers are offsets too)
        per_batch = max(1, min(size.memory_batch_records, data.messages // (size.memory_batches + 10)))
        worker = Worker(self.spec(EO_PARTITION))
        try:
            numbers = worker.call(
                "memory",
                data=data,
                batch_records=per_batch,
                batches=size.memory_batches,
                every=size.memory_every,
            )
        finally:
            worker.close()
        self.memory = {
            "partitions": data.partitions,
            "topic": data.topic,
            "batch_records": per_batch,
            "from_batch": size.memory_from,
            **numbers,
        }
        self.memory |= report.memory_growth(self.memory)
        m = self.memory
        say(
            f"memory {numbers['batches']} batches of <= {per_batch} records in {numbers['seconds']:.1f}s: "
            f"Python workers {m['workers_mb_from']:.1f} MB at batch {m['sampled_from']}"
            f" -> {m['workers_mb_to']:.1f} MB at batch {m['sampled_to']} "
            f"({m['workers_rss_growth_mb']:+.1f} MB, {m['workers_rss_growth_pct']:+.1f} %)"
        )

    def close(self, *, keep: bool = False) -> None:
        """Delete the bench's topics and offsets schema; `keep`: leave them (and say so) for a run
        whose result was wrong to be looked at - which records Kafka holds, what the job committed."""
        topics = [d.topic for d in self.datasets.values()]
        if keep:
            say(
                f"a result was wrong: kept topics {', '.join(topics) or '(none)'} and schema "
                f"{self.db.schema} (the jobs' offsets and lineage) for inspection; remove them by hand "
                f'(AdminClient.delete_topics, DROP SCHEMA "{self.db.schema}" CASCADE)'
            )
        else:
            delete_topics(self.kafka, topics)
            with self.engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.db.schema}" CASCADE'))
        self.engine.dispose()


def schedule(order: list[str], wanted: dict[str, int]) -> list[tuple[str, str]]:
    """(contender, fresh|warm) in the order to run them: each contender's fresh run in `order`,
    then rounds of one warm run per contender that still wants one, round k starting k + 1
    contenders further on (so no contender is always first, or always last, among the warm runs)."""
    runs = [(c, FRESH) for c in order]
    for k in range(max(wanted.values(), default=0)):
        runs += [(c, WARM) for c in _rotated(tuple(order), k + 1) if k < wanted[c]]
    return runs


def _rotated(items: tuple[str, ...], by: int) -> list[str]:
    k = by % len(items)
    return [*items[k:], *items[:k]]


def wrong_result(exc: BaseException) -> bool:
    """Whether `exc` is a contender's result differing from the oracle (in a worker or here)."""
    return isinstance(exc, sink.WrongResult) or (isinstance(exc, WorkerFailed) and exc.kind == "WrongResult")


def measure(size: Size) -> dict[str, Any]:
    """Produce the topics, run the sweep and the latency probes; the result (not yet published)."""
    started = time.perf_counter()
    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=f"bench_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(db)
    examples_migrate.upgrade(db)
    jars = tuple(str(p) for p in spark_kafka_jars(timeout_s=600))
    bench = Bench(size, db, kafka, jars)
    say(
        f"size={size.name} points={', '.join(p.name for p in bench.points)} "
        f"contenders={','.join(size.contenders)}"
    )
    try:
        described = machine.describe(bench.engine)
        deleted, topics, kept = sink.remove_leftovers(bench.engine, kafka)
        if deleted:
            say(f"removed {deleted:,} result rows of {topics} benchmark topics Kafka no longer has")
        if kept:
            say(f"the result table holds {kept:,} rows of other topics: they slow every writer")
        bench.produce()
        if SWEEP in size.phases:
            bench.sweep()
        if SCALE in size.phases:
            bench.scale()
        if MEMORY in size.phases:
            bench.memory_phase()
        if LATENCY in size.phases:
            bench.latency_phase()
        if LINEAGE in size.phases:
            bench.lineage = lineage.phase(bench)
        if MODES in size.phases:
            bench.modes = modes.phase(bench)
    except BaseException as exc:
        bench.close(keep=wrong_result(exc))
        raise
    bench.close()
    small, large = size.headline(size.small_cap), size.headline(size.large_cap)
    reduced = size.name == "full" and size.messages < FULL.messages
    result = {
        "meta": {
            "size": size.name,
            "messages": size.messages,
            "reduced_note": f", reduced from {FULL.messages:,}" if reduced else "",
            "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.perf_counter() - started,
            "settings": asdict(size),
            "points": [
                {
                    "name": p.name,
                    "partitions": p.partitions,
                    "cap": p.cap,
                    "messages": p.messages,
                    "topic": getattr(bench.datasets.get((p.partitions, p.messages, False)), "topic", None),
                }
                for p in bench.points
            ],
            "headline_points": [small.name, large.name],
            "machine": described,
            "machine_summary": machine.summary(described),
            "follow_interval_s": FOLLOW_INTERVAL_S,
            "spark_master": SPARK_MASTER,
            "task_slots": SPARK_TASK_SLOTS,
        },
        "runs": bench.runs,
        "latency": bench.latency,
        "scale": report.scale_summary(bench.scale_runs, size.scale_partitions, size.scale_batch_records)
        | ({"more": bench.scale_more} if bench.scale_more else {})
        | ({"user": bench.scale_user} if bench.scale_user else {}),
        "memory": bench.memory,
        # the latency phase; the low-latency mode's throughput at the large cap over batch mode's
        # (best warm run of each, lowlatency.throughput_ratio; None without the phase)
        "latency_phase": bench.latency_phase_runs,
        "low_latency_throughput": {
            "runs": bench.throughput_runs,
            **lowlatency.throughput_ratio(bench.throughput_runs),
        },
        "low_latency_throughput_vs_batch": lowlatency.throughput_ratio(bench.throughput_runs)["ratio"],
        "lineage": bench.lineage,
        "modes": bench.modes,
    }
    result["headline"] = report.headline(result)
    result["findings"] = report.findings(result)
    return result


def publish(result: dict[str, Any], out: Path, docs: bool) -> None:
    """JSON + PNG (+ docs/benchmarks.md), the table, and the ratio line last."""
    png = DOC.with_suffix(".png") if docs else out.with_suffix(".png")
    plot.plot(result, png)
    report.write_json(result, out)
    if docs:
        report.write_json(result, RESULTS / "full.json")
        report.update_docs(DOC, report.markdown(result, png.name))
    print()
    print(report.console_table(result))
    print()
    say(f"json {out}; plot {png}{'; docs/benchmarks.md updated' if docs else ''}")
    print(report.latency_line(report.latency_figures(result)), flush=True)
    if scale.line(result):
        print(scale.line(result), flush=True)
    if result.get("lineage"):
        print(lineage.line(result["lineage"]), flush=True)
    print(report.findings_line(report.findings(result)), flush=True)
    print(report.final_line(report.headline(result), result), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", default=None, help="smoke | full (default: BENCH_SIZE, else full)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: benchmarks/results/)")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="update docs/benchmarks.md and its PNG (default: only for full)",
    )
    parser.add_argument(
        "--render", type=Path, default=None, help="publish a saved JSON again, measure nothing"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.render is not None:
        result = json.loads(args.render.read_text())
        result["meta"]["machine_summary"] = machine.summary(result["meta"]["machine"])
        docs = bool(args.docs) if args.docs is not None else result["meta"]["size"] == "full"
        publish(result, args.out or args.render, docs)
        return 0
    size = size_from_env(args.size)
    docs = args.docs if args.docs is not None else size.name == "full"
    result = measure(size)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    saved = RESULTS / "full.json"
    if docs and partial.is_partial(size.phases) and saved.exists():  # only these phases' sections
        result = partial.merge(json.loads(saved.read_text()), result, size.phases)
        result["headline"] = report.headline(result)
        result["findings"] = report.findings(result)
    publish(result, args.out or RESULTS / f"{size.name}-{stamp}.json", docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
