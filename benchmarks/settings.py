"""What ``make bench`` measures: the sizes, the sweep points, the contenders and the headline ratios.

Everything the other modules need to agree on lives here, as plain frozen data (it is pickled to
the worker processes).

Warm runs: each contender runs ``warm_runs`` times after its fresh run and the *best* warm run
counts (the fastest is the run least disturbed by the other processes on a shared machine). The
contenders of the headline ratios (HEADLINE_CONTENDERS: both sides of every ratio, so no ratio
compares a best of 4 with a best of 2) run ``headline_warm_runs`` warm runs at the headline points
instead (the reader limits: on the large headline point's topic). At the large point a run is only
a few batches of 40,000 records per partition, over in a few seconds: with 2 warm runs one
disturbed run decided eo_vs_alo and reader_vs_raw (0.66 <-> 1.84 between reduced runs). Best-of
rather than the median: the median of 4 still moves with how busy the machine was during half of
the runs, the best of 4 only needs one quiet run per contender. The extra runs are the headline
points' fast runs only (a few % of a full run's time).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

# The contenders. Spark ones run in a worker process with its own SparkSession (and JVM).
EO_PARTITION = "eo_partition"  # txn_offsets run_job + PartitionWriter (examples/windowed_counts.py)
EO_FRAME = "eo_frame"  # the same job on the DataFrame execution path (run_job(execution="dataframe"))
EO_BATCH = "eo_batch"  # txn_offsets run_job + BatchWriter (Spark computes, the driver commits)
EO_BATCH_MERGED = "eo_batch_merged"  # the same BatchWriter, its compute one stage (the modes phase only)
EO_CONNECT = "eo_connect"  # eo_partition through a Spark Connect session (the modes phase only)
EO_STREAM = "eo_stream"  # txn_offsets Structured Streaming adapter: format("txn_offsets") + exactly-once sink
ALO = "alo"  # the same read/aggregate/upsert per range, no claim and no stored offsets
SSS = "sss"  # Spark Structured Streaming, JVM Kafka source, foreachBatch upsert
READER = "reader"  # one Python process: confluent-kafka consume + decode + aggregate (no Spark, no DB)
READER_SLOTS = "reader_slots"  # the same loop in SPARK_TASK_SLOTS processes, partitions split round-robin
UPSERT = "upsert"  # the per-range result rows written with upsert_add (what txn_offsets writes)
COPY = "copy_merge"  # the same rows written with COPY into a temp table + one merge statement
# the latency phase's followers beyond EO_PARTITION (batch mode) and SSS: txn_offsets' low-latency
# mode of run_job (issue 25 part 1: reported n/a until its entry point exists) and Spark's
# real-time mode with a foreach writer, at-least-once or the exactly-once row sink (benchmarks/rtm.py)
EO_LOW_LATENCY = "eo_low_latency"
RTM_ALO = "rtm_alo"
RTM_EO = "rtm_eo"

# The Spark contenders' session: local[SPARK_TASK_SLOTS], i.e. that many tasks (Python workers) at
# once. The per-slot reader limit runs the raw loop in as many processes.
SPARK_TASK_SLOTS = 2
SPARK_MASTER = f"local[{SPARK_TASK_SLOTS}]"

SPARK_CONTENDERS = (EO_PARTITION, EO_FRAME, EO_BATCH, EO_STREAM, ALO, SSS)
LIMIT_CONTENDERS = (READER, READER_SLOTS, UPSERT, COPY)
READERS = (READER, READER_SLOTS)  # run once per topic, not per point
# both sides of the headline ratios: more warm runs at the headline points (headline_warm_runs)
HEADLINE_CONTENDERS = (EO_PARTITION, ALO, SSS, READER, READER_SLOTS, UPSERT, COPY)
FOLLOWERS = (EO_PARTITION, SSS)  # the caught-up latency probe of the sweep
LATENCY_FOLLOWERS = (EO_PARTITION, EO_LOW_LATENCY, SSS, RTM_ALO, RTM_EO)  # the latency phase
RTM_FOLLOWERS = (RTM_ALO, RTM_EO)
# the latency phase's load (whatever the size; BENCH_LATENCY_SECONDS sets its length)
LATENCY_PARTITIONS, LATENCY_RATE = 8, 2_000
LABELS = {
    EO_PARTITION: "txn_offsets PartitionWriter",
    EO_FRAME: "txn_offsets PartitionWriter, DataFrame path",
    EO_CONNECT: "txn_offsets PartitionWriter, Spark Connect",
    EO_BATCH: "txn_offsets BatchWriter",
    EO_BATCH_MERGED: "txn_offsets BatchWriter, one-stage compute",
    EO_STREAM: "txn_offsets Structured Streaming",
    ALO: "at-least-once (no offsets)",
    SSS: "Structured Streaming",
    READER: "reader limit (1 process)",
    READER_SLOTS: f"reader limit ({SPARK_TASK_SLOTS} processes)",
    UPSERT: "writes: upsert_add",
    COPY: "writes: COPY + merge",
    EO_LOW_LATENCY: "txn_offsets low-latency mode",
    RTM_ALO: "real-time mode, at-least-once foreach",
    RTM_EO: "real-time mode, txn_offsets exactly-once sink",
}

FRESH = "fresh"  # the first run in a new process (JVM start excluded, reported apart)
WARM = "warm"  # a later run in the same process and SparkSession (what a long-running job sees)

# The phases of a run: the sweep (above), the per-batch cost at two partition counts and the same
# records per batch ("scale"), the Python workers' memory over many small batches ("memory"), and
# the caught-up latency of every follower at LATENCY_RATE over LATENCY_PARTITIONS ("latency"; not in
# the smoke size's default phases: BENCH_PHASES=latency runs it alone); the lineage's cost in
# records/s ("lineage", benchmarks/lineage.py; not in the smoke size); each mode of txn_offsets
# against its reference in alternating warm rounds of one worker ("modes", benchmarks/modes.py; not
# in the smoke size).
SWEEP, SCALE, MEMORY, LATENCY, LINEAGE, MODES = "sweep", "scale", "memory", "latency", "lineage", "modes"
PHASES = (SWEEP, SCALE, MEMORY, LATENCY, LINEAGE, MODES)


@dataclass(frozen=True)
class Point:
    """One sweep configuration: a topic of `messages` records over `partitions`, read in batches of
    `batch_offsets` = cap x partitions offsets (`cap` per partition on average). txn_offsets shares
    a batch in proportion to each partition's backlog (``Limits(max_records_per_batch=...,
    batch_share="backlog")``) and SSS its ``maxOffsetsPerTrigger`` of the same value, so both read
    alike batches, also of a skewed topic."""

    partitions: int
    cap: int
    messages: int

    @property
    def name(self) -> str:
        return f"p{self.partitions}-c{self.cap}"

    @property
    def batch_offsets(self) -> int:
        return self.cap * self.partitions


@dataclass(frozen=True)
class ScaleMore:
    """The scale phase at thousands of partitions and with many jobs (benchmarks/scale.py)."""

    many: tuple[int, ...]  # partition counts timed per batch against scale_partitions[0]
    many_batches: int  # batches of scale_batch_records in their topics
    plans: int  # plans timed at max(many) partitions (after a first, seeding one)
    hot_partitions: int  # rows of the offsets table claimed by every batch of claims
    hot_batches: tuple[int, int]  # the HOT ratio and table size after this many batches, then this
    jobs: int  # jobs on threads of one Spark application (FAIR), a topic each
    job_partitions: int
    job_records: int  # records per job's topic
    job_batches: int  # batches per job (each capped at job_records / job_batches offsets)
    job_small_records: int  # the same again with this many records per topic (0: not run)
    job_rounds: int  # rounds of (N jobs, one job over the N topics), alternating
    # the README-shaped job (benchmarks/user_scale.py) at scale_partitions[0] and max(many): a first
    # run of each, then this many rounds, alternating (5, as the modes phase's eo_vs_alo: six rounds
    # in one application gave ratios from 4.4 to 6.5, the 8-partition runs of 8 batches the noisy side)
    user_rounds: int = 5


FULL_MORE = ScaleMore(
    many=(1_024, 4_096),
    many_batches=8,
    plans=20,
    hot_partitions=8,
    hot_batches=(100, 10_000),
    jobs=32,
    job_partitions=2,
    # batches of 5,000 records per job, 8 of them: the 32 runs' start (runs, first plans, the first
    # round gathered: ~0.4 s, against ~0.1 s for one job) weighs as in a run of minutes, not half
    # as much again as it did over 4 batches (2026-11-27: runs of ~5 s, 0.79)
    job_records=40_000,
    job_batches=8,
    job_small_records=2_000,  # batches of 500: the per-batch costs alone
    job_rounds=4,  # best of 4 each, alternating: the 32 jobs vary by ~0.5 s run to run here
)
SMOKE_MORE = ScaleMore(
    many=(128,),  # the pair's own topic: no more runs
    many_batches=3,
    plans=3,
    hot_partitions=8,
    hot_batches=(10, 50),
    jobs=2,
    job_partitions=2,
    job_records=300,
    job_batches=1,  # one batch per job: the smoke checks the fields, not the figure
    job_small_records=0,
    job_rounds=1,
    user_rounds=0,  # the first runs only: the smoke checks the field, not the figure
)


@dataclass(frozen=True)
class Size:
    name: str
    messages: int  # records per topic
    partitions: tuple[int, ...]
    small_cap: int
    large_cap: int
    # a point's topic holds at most cap x partitions x max_batches records, so that a small cap does
    # not mean thousands of batches (skewed partitions still need more than max_batches)
    max_batches: int
    latency_rate: int  # records/s of the steady producer
    latency_seconds: float
    repeat: int  # rounds over the contenders (order rotated each round); the best warm run counts
    warm_runs: int  # warm runs after each fresh one, in the same process
    # warm runs of HEADLINE_CONTENDERS at the headline points (at least warm_runs)
    headline_warm_runs: int
    contenders: tuple[str, ...]  # which of SPARK_CONTENDERS + LIMIT_CONTENDERS run
    process_per_point: bool  # True: a fresh worker per (point, contender); False: per contender
    # scale: eo_partition with Limits(max_records_per_batch=scale_batch_records) on topics of
    # scale_partitions[0] and [1] partitions, alternating, scale_runs runs of each after a first one
    scale_partitions: tuple[int, int]
    scale_batch_records: int
    scale_runs: int
    # memory: one eo_partition job of memory_batches batches of at most memory_batch_records
    # records (max_records_per_batch) on the headline topic, the Python workers' RSS sampled
    # every memory_every batches; growth is measured from batch memory_from to the last
    memory_batches: int
    memory_batch_records: int
    memory_every: int
    memory_from: int
    phases: tuple[str, ...] = PHASES
    scale_more: ScaleMore = FULL_MORE
    lineage_runs: int = 3  # lineage: warm runs with and without the commits rows, alternating
    # the latency phase's throughput comparison: warm runs of the low-latency mode and of batch mode
    # each (alternating, after a first run of each) on a topic of `messages` over LATENCY_PARTITIONS
    low_latency_runs: int = 2
    # modes: warm rounds of every mode and its reference, alternating, after `modes_warmup` rounds
    # of each (not counted)
    modes_rounds: int = 5
    modes_warmup: int = 2

    @property
    def headline_partitions(self) -> int:
        return 8 if 8 in self.partitions else self.partitions[-1]

    def points(self) -> list[Point]:
        out = []
        for partitions in self.partitions:
            for cap in (self.small_cap, self.large_cap):
                messages = min(self.messages, cap * partitions * self.max_batches)
                out.append(Point(partitions, cap, messages))
        return out

    def headline(self, cap: int) -> Point:
        return next(p for p in self.points() if p.partitions == self.headline_partitions and p.cap == cap)

    def warm_runs_of(self, contender: str, headline: bool) -> int:
        """Warm runs of `contender` at a point (a reader limit: on a topic); `headline`: a headline
        point (for the reader limits: the large headline point's topic)."""
        if headline and contender in HEADLINE_CONTENDERS:
            return max(self.warm_runs, self.headline_warm_runs)
        return self.warm_runs


FULL = Size(
    name="full",
    messages=1_000_000,
    partitions=(1, 8, 128),
    small_cap=1_000,
    large_cap=40_000,
    max_batches=40,
    latency_rate=2_000,
    latency_seconds=60.0,
    repeat=1,
    warm_runs=2,
    headline_warm_runs=4,
    contenders=(*SPARK_CONTENDERS, *LIMIT_CONTENDERS),
    process_per_point=True,
    scale_partitions=(8, 128),
    scale_batch_records=8_000,
    scale_runs=2,
    memory_batches=500,
    memory_batch_records=200,
    memory_every=10,
    memory_from=50,
)
SMOKE = Size(
    name="smoke",
    messages=2_000,
    partitions=(1, 8),
    small_cap=100,
    large_cap=40_000,
    max_batches=3,
    latency_rate=400,
    latency_seconds=4.0,
    repeat=1,
    warm_runs=1,
    headline_warm_runs=1,
    contenders=(*SPARK_CONTENDERS, *LIMIT_CONTENDERS),
    process_per_point=False,
    scale_partitions=(8, 128),
    scale_batch_records=500,
    scale_runs=1,
    memory_batches=40,
    memory_batch_records=40,
    memory_every=5,
    memory_from=5,
    phases=(SWEEP, SCALE, MEMORY),
    scale_more=SMOKE_MORE,
)


def size_from_env(name: str | None = None) -> Size:
    """BENCH_SIZE (smoke|full), then the knobs: BENCH_MESSAGES, BENCH_PARTITIONS (e.g. "1,8"),
    BENCH_REPEAT, BENCH_WARM_RUNS, BENCH_HEADLINE_WARM_RUNS, BENCH_MAX_BATCHES, BENCH_CONTENDERS
    (e.g. "eo_partition,sss"), BENCH_LATENCY_SECONDS, BENCH_LATENCY_RATE, BENCH_PHASES (e.g.
    "scale,memory", "latency" or "lineage"), BENCH_SCALE_RECORDS, BENCH_SCALE_RUNS, BENCH_MEMORY_BATCHES,
    BENCH_LINEAGE_RUNS, BENCH_LOW_LATENCY_RUNS, BENCH_MODES_ROUNDS, BENCH_MODES_WARMUP; the scale
    phase's extension: more_from_env."""
    chosen = (name or os.environ.get("BENCH_SIZE") or "full").strip().lower()
    sizes = {FULL.name: FULL, SMOKE.name: SMOKE}
    if chosen not in sizes:
        raise SystemExit(f"bench: BENCH_SIZE={chosen!r}: use smoke or full")
    base = sizes[chosen]
    env = os.environ
    partitions = base.partitions
    contenders = base.contenders
    if env.get("BENCH_CONTENDERS"):
        contenders = tuple(c.strip() for c in env["BENCH_CONTENDERS"].split(",") if c.strip())
        unknown = set(contenders) - set(base.contenders)
        if unknown:
            raise SystemExit(f"bench: unknown BENCH_CONTENDERS {sorted(unknown)}: use {base.contenders}")
    phases = base.phases
    if env.get("BENCH_PHASES"):
        phases = tuple(p.strip() for p in env["BENCH_PHASES"].split(",") if p.strip())
        if set(phases) - set(PHASES):
            raise SystemExit(f"bench: unknown BENCH_PHASES {sorted(set(phases) - set(PHASES))}: use {PHASES}")
    if env.get("BENCH_PARTITIONS"):
        # in the order given (the sweep runs them in that order)
        partitions = tuple(dict.fromkeys(int(p) for p in env["BENCH_PARTITIONS"].split(",") if p.strip()))
    return Size(
        name=base.name,
        messages=int(env.get("BENCH_MESSAGES", base.messages)),
        partitions=partitions,
        small_cap=base.small_cap,
        large_cap=base.large_cap,
        max_batches=int(env.get("BENCH_MAX_BATCHES", base.max_batches)),
        latency_rate=int(env.get("BENCH_LATENCY_RATE", base.latency_rate)),
        latency_seconds=float(env.get("BENCH_LATENCY_SECONDS", base.latency_seconds)),
        repeat=int(env.get("BENCH_REPEAT", base.repeat)),
        warm_runs=int(env.get("BENCH_WARM_RUNS", base.warm_runs)),
        headline_warm_runs=int(env.get("BENCH_HEADLINE_WARM_RUNS", base.headline_warm_runs)),
        contenders=contenders,
        process_per_point=base.process_per_point,
        scale_partitions=base.scale_partitions,
        scale_batch_records=int(env.get("BENCH_SCALE_RECORDS", base.scale_batch_records)),
        scale_runs=int(env.get("BENCH_SCALE_RUNS", base.scale_runs)),
        memory_batches=int(env.get("BENCH_MEMORY_BATCHES", base.memory_batches)),
        memory_batch_records=base.memory_batch_records,
        memory_every=base.memory_every,
        memory_from=min(base.memory_from, int(env.get("BENCH_MEMORY_BATCHES", base.memory_batches))),
        phases=phases,
        low_latency_runs=int(env.get("BENCH_LOW_LATENCY_RUNS", base.low_latency_runs)),
        lineage_runs=int(env.get("BENCH_LINEAGE_RUNS", base.lineage_runs)),
        modes_rounds=int(env.get("BENCH_MODES_ROUNDS", base.modes_rounds)),
        modes_warmup=max(1, int(env.get("BENCH_MODES_WARMUP", base.modes_warmup))),
        scale_more=more_from_env(base.scale_more),
    )


def more_from_env(base: ScaleMore) -> ScaleMore:
    """BENCH_SCALE_MANY (partition counts, e.g. "1024,4096"), BENCH_SCALE_MANY_BATCHES, BENCH_JOBS,
    BENCH_HOT_BATCHES (the second checkpoint), BENCH_HOT_PARTITIONS."""
    env = os.environ
    many = base.many
    if env.get("BENCH_SCALE_MANY"):
        many = tuple(int(p) for p in env["BENCH_SCALE_MANY"].split(",") if p.strip())
    hot = (base.hot_batches[0], int(env.get("BENCH_HOT_BATCHES", base.hot_batches[1])))
    return replace(
        base,
        many=many,
        many_batches=int(env.get("BENCH_SCALE_MANY_BATCHES", base.many_batches)),
        jobs=int(env.get("BENCH_JOBS", base.jobs)),
        hot_batches=hot,
        hot_partitions=int(env.get("BENCH_HOT_PARTITIONS", base.hot_partitions)),
    )
