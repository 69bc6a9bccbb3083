"""The scenarios F1..F11: set up fresh topics and a fresh schema, run the job, break it, check.

Each scenario returns a :class:`ScenarioResult`; every random choice comes from the session's
seeded generator, so a seed replays the same faults at the same points (Spark's thread timing
aside). Every wait is bounded by a deadline; every job process is reaped by :mod:`chaos.procs`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as KTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

from chaos.faults import EXECUTOR_POINTS, KILL_POINTS, FaultPlan, tables
from chaos.invariants import KafkaLog, check_run, install_history, read_log
from chaos.procs import REPO, JobProcess, JobResult
from chaos.report import ScenarioResult
from examples import pageviews
from txn_offsets import migrate
from txn_offsets.config import DatabaseSettings, validate_identifier
from txn_offsets.spark.cluster import StandaloneCluster

__all__ = ["Context", "Services", "scenario"]

logger = logging.getLogger(__name__)

JOB_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Services:
    database_url: str
    admin_database_url: str
    kafka_bootstrap: str
    stack_dir: Path | None  # None: PostgreSQL/Kafka cannot be restarted from here


@dataclass
class Context:
    """What every scenario needs: services, the seeded generator, and cleanup of what it made."""

    services: Services
    seed: int
    work_dir: Path
    keep: bool = False
    rng: random.Random = field(init=False)
    engine: sa.Engine = field(init=False)
    admin_engine: sa.Engine = field(init=False)
    admin: AdminClient = field(init=False)
    topics: list[str] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # pre_ping: connections outlive Postgres restarts (F3) in these pools
        self.engine = sa.create_engine(self.services.database_url, pool_pre_ping=True, hide_parameters=True)
        self.admin_engine = sa.create_engine(
            self.services.admin_database_url, pool_pre_ping=True, hide_parameters=True
        )
        self.admin = AdminClient({"bootstrap.servers": self.services.kafka_bootstrap})

    # --- resources -------------------------------------------------------------------------
    def name(self, prefix: str) -> str:
        return f"{prefix}_{self.rng.getrandbits(48):012x}"

    def schema(self) -> str:
        """A fresh schema with the offsets tables (migrated), the result tables and the triggers."""
        schema = validate_identifier(self.name("chaos"), "schema")
        self.schemas.append(schema)
        migrate.upgrade(DatabaseSettings(self.services.database_url, schema=schema))
        t = tables(schema)
        with self.engine.begin() as conn:
            t.counts.metadata.create_all(conn)
            install_history(conn, schema)
        return schema

    def topic(self, partitions: int, config: dict[str, str] | None = None) -> str:
        name = self.name("chaos").replace("_", "-")
        fut = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )[name]
        fut.result(timeout=30)
        self.topics.append(name)
        return name

    def produce(self, topic: str, messages: int, partitions: int) -> pageviews.Oracle:
        """Committed page views in Kafka transactions, every 10th aborted (F10, in every scenario)."""
        return pageviews.produce(
            self.services.kafka_bootstrap,
            topic,
            messages,
            partitions=partitions,
            per_transaction=2_000,
            abort_every=10,
            seed=self.rng.getrandbits(32),
        )

    def log(self, topics: Mapping[str, int]) -> KafkaLog:
        return read_log(self.services.kafka_bootstrap, topics)

    def cleanup(self) -> None:
        if self.keep:
            return
        for schema in self.schemas:
            with contextlib.suppress(sa.exc.SQLAlchemyError), self.engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        if self.topics:
            for fut in self.admin.delete_topics(self.topics, operation_timeout=30).values():
                with contextlib.suppress(KafkaException):
                    fut.result(timeout=30)
        self.engine.dispose()
        self.admin_engine.dispose()

    # --- jobs ------------------------------------------------------------------------------
    def job(
        self,
        run_dir: Path,
        *,
        job: str,
        schema: str,
        topics: list[str],
        max_per_partition: int,
        faults: FaultPlan | None = None,
        extra: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> JobProcess:
        run_dir.mkdir(parents=True, exist_ok=True)
        plan = faults or FaultPlan(seed=self.seed)
        args = [
            "--job",
            job,
            "--topics",
            ",".join(topics),
            "--schema",
            schema,
            "--kafka-bootstrap",
            self.services.kafka_bootstrap,
            "--app-name",
            _app_name(job),
            "--max-per-partition",
            str(max_per_partition),
            "--run-dir",
            str(run_dir),
            "--faults",
            json.dumps({k: v for k, v in asdict(plan).items() if k != "driver_pid"}),
            *(extra or []),
        ]
        full_env = {
            **os.environ,
            "TXN_OFFSETS_DATABASE_URL": self.services.database_url,
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        return JobProcess(args, full_env, run_dir / "job.log")

    def stored(self, schema: str, job: str) -> dict[tuple[str, int], int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f'SELECT topic, part, off FROM "{schema}".offsets WHERE job = :j'), {"j": job}
            )
            return {(r.topic, r.part): int(r.off) for r in rows}

    def wait_caught_up(
        self, jp: JobProcess, schema: str, job: str, ends: Mapping[tuple[str, int], int], timeout_s: float
    ) -> bool:
        """Until the stored offsets reach `ends` (True) or the job exits / the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and jp.running():
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                if self.stored(schema, job) == dict(ends):
                    return True
            time.sleep(0.5)
        return False

    def check(
        self,
        result: ScenarioResult,
        *,
        schema: str,
        job: str,
        log: KafkaLog,
        final: bool,
        when: str,
        excluded: Mapping[tuple[str, int], list[tuple[int, int]]] | None = None,
    ) -> None:
        check = check_run(self.engine, schema=schema, job=job, log=log, final=final, excluded=excluded)
        result.add(check, when=when)


def _app_name(job: str) -> str:
    return f"chaos-{job}"[:63]


def _wait_file(path: Path, jp: JobProcess, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and jp.running():
        if path.exists():
            return True
        time.sleep(0.1)
    return path.exists()


def _expect_ok(result: ScenarioResult, res: JobResult, what: str) -> None:
    if res.returncode != 0:
        result.fail(f"{what}: job exited {res.returncode}: {res.last_error() or res.log[-800:]}")


def _producer_matches(result: ScenarioResult, log: KafkaLog, *oracles: pageviews.Oracle) -> None:
    """The producer's own count must equal what Kafka holds: guards the oracle itself."""
    produced = sum(o.messages for o in oracles)
    if log.records != produced:
        result.fail(f"oracle: Kafka holds {log.records} committed records, the producer committed {produced}")


Scenario = Callable[[Context, int, int], ScenarioResult]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


# --- F1 ------------------------------------------------------------------------------------
@scenario("F1")
def f1_driver_kills(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of the driver at random points (timer, after planning, while reading, after the
    claim, during COMMIT, after COMMIT), each followed by a restart (--force: the dead run's lease
    is still live)."""
    result = ScenarioResult("F1")
    parts = 8
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f1")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    # small batches: each killed run gets through a few of them, and `kills` runs fit in the data
    mpp = max(100, messages // parts // (3 * kills + 4))
    modes = list(KILL_POINTS)
    ctx.rng.shuffle(modes)
    attempts = 0
    while result.faults < kills and attempts < kills * 2:
        attempts += 1
        mode = modes[result.faults % len(modes)]
        run_dir = ctx.work_dir / "F1" / f"run-{attempts:03d}"
        plan = FaultPlan(seed=ctx.seed)
        extra = ["--force"]
        if mode == "plan":
            extra += ["--kill-at-plan", str(ctx.rng.randint(1, 3))]
        elif mode != "timer":
            plan = FaultPlan(
                seed=ctx.seed, kill_point=mode, kill_after=ctx.rng.randint(1, 2 * parts), run_dir=str(run_dir)
            )
        jp = ctx.job(
            run_dir, job=job, schema=schema, topics=[topic], max_per_partition=mpp, faults=plan, extra=extra
        ).start()
        result.runs += 1
        if mode == "timer":
            # after the first batch committed: the kill lands anywhere in the following ones
            _wait_file(run_dir / "batches", jp, 120)
            time.sleep(ctx.rng.uniform(0.0, 2.0))
            jp.kill9()
        res = jp.wait(JOB_TIMEOUT_S)
        if res.killed:
            result.faults += 1
        elif res.returncode == 0:
            result.notes.append(f"run {attempts} ({mode}) caught up before its kill")
            break
        else:
            result.fail(f"F1 run {attempts} ({mode}): exited {res.returncode}: {res.last_error()}")
        ctx.check(
            result, schema=schema, job=job, log=log, final=False, when=f"after kill {attempts} ({mode})"
        )
    final = ctx.job(
        ctx.work_dir / "F1" / "final",
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=mpp * 4,
        extra=["--force"],
    ).start()
    result.runs += 1
    _expect_ok(result, final.wait(JOB_TIMEOUT_S), "F1 final run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F1 final")
    if result.faults < kills:
        result.fail(f"F1: only {result.faults} of {kills} kills landed")
    return result


# --- F2 ------------------------------------------------------------------------------------
@scenario("F2")
def f2_executor_faults(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """A task fails on its first attempt before the write, after the claim (raise, and a worker
    crash), after the write, or after COMMIT; Spark retries it (local[2,3])."""
    result = ScenarioResult("F2")
    parts = 8
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f2")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    plan = FaultPlan(seed=ctx.seed, executor_rate=0.5, executor_points=EXECUTOR_POINTS)
    mpp = max(100, messages // parts // 5)
    jp = ctx.job(
        ctx.work_dir / "F2", job=job, schema=schema, topics=[topic], max_per_partition=mpp, faults=plan
    )
    res = jp.start().wait(JOB_TIMEOUT_S)
    result.runs += 1
    _expect_ok(result, res, "F2 run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F2")
    # which faults fired follows from the seed and the ranges that were applied
    hits: dict[str, int] = dict.fromkeys(EXECUTOR_POINTS, 0)
    with ctx.engine.connect() as conn:
        applied = conn.execute(
            sa.select(
                tables(schema).applied.c.topic,
                tables(schema).applied.c.part,
                tables(schema).applied.c.start_off,
            )
        ).all()
    for t, p, start in applied:
        first = _first_offset(log, (t, p), int(start))
        if first is not None and plan.executor_point((t, p, first)) == "before_write":
            hits["before_write"] += 1
            continue
        point = plan.executor_point((t, p, int(start)))
        if point is not None and point != "before_write":
            hits[point] += 1
    result.faults = sum(hits.values())
    result.notes.append(", ".join(f"{k}={v}" for k, v in hits.items()))
    missing = [k for k, v in hits.items() if v == 0]
    if missing:
        result.fail(f"F2: no fault at {missing}: use more messages")
    if hits["after_commit"] and "already_committed=0 stopped_by" in res.last_error():
        result.fail("F2: after_commit faults fired but no retry reported already_committed")
    return result


def _first_offset(log: KafkaLog, tp: tuple[str, int], start: int) -> int | None:
    import bisect

    offs = log.offsets.get(tp)
    if offs is None:
        return None
    i = bisect.bisect_left(offs, start)
    return offs[i] if i < len(offs) else None


# --- F3 / F4 -------------------------------------------------------------------------------
def _terminate(ctx: Context, app: str, where: str) -> int:
    """pg_terminate_backend of the job's connections that are inside a transaction (`txn`) or
    executing COMMIT (`commit`); returns how many were hit."""
    cond = "state = 'idle in transaction'" if where == "txn" else "state = 'active' AND query = 'COMMIT'"
    with ctx.admin_engine.connect() as conn:
        return len(
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE application_name = :app AND {cond}"  # cond is one of two constants
                ),
                {"app": app},
            ).all()
        )


def _supervise(
    ctx: Context,
    result: ScenarioResult,
    *,
    name: str,
    job: str,
    schema: str,
    topics: list[str],
    ends: Mapping[tuple[str, int], int],
    mpp: int,
    plan: FaultPlan,
    events: list[str],
) -> None:
    """Run the job (following) while injecting `events`; restart it when it gives up (as a
    supervisor would); stop it with SIGTERM once it has caught up."""
    pending = list(events)
    restarts = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        run_dir = ctx.work_dir / name / f"run-{restarts:02d}"
        jp = ctx.job(
            run_dir,
            job=job,
            schema=schema,
            topics=topics,
            max_per_partition=mpp,
            faults=plan,
            extra=["--follow", "--force"],
        ).start()
        result.runs += 1
        _wait_file(run_dir / "batches", jp, 120)
        while pending and jp.running() and time.monotonic() < deadline:
            event = pending[0]
            if event in ("restart_postgres", "restart_kafka"):
                from txn_offsets.devstack import Stack

                stack = Stack(ctx.services.stack_dir or Path(".stack"))
                if event == "restart_postgres":
                    stack.restart_postgres_immediate()
                else:
                    stack.restart_kafka()
                hit = 1
            else:
                hit = _terminate(ctx, _app_name(job), event)
            if hit:
                result.faults += 1
                pending.pop(0)
                time.sleep(ctx.rng.uniform(0.3, 1.5))
            else:
                time.sleep(0.02)
        caught_up = ctx.wait_caught_up(jp, schema, job, ends, 300)
        jp.terminate()
        res = jp.wait(120)
        if caught_up and not pending:
            _expect_ok(result, res, f"{name} last run")
            return
        restarts += 1
        result.notes.append(f"run {restarts} gave up: {res.last_error()[:160]}")
        if restarts > 6:
            result.fail(f"{name}: the job did not recover after {restarts} restarts")
            return
    result.fail(f"{name}: deadline passed")


@scenario("F3")
def f3_postgres(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """pg_terminate_backend of the job's connections mid-transaction and during COMMIT, and a
    PostgreSQL `-m immediate` restart mid-run."""
    result = ScenarioResult("F3")
    parts = 4
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f3")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    events = ["txn", "commit"] * 3
    ctx.rng.shuffle(events)
    if ctx.services.stack_dir is not None:
        events.insert(len(events) // 2, "restart_postgres")
    else:
        result.notes.append("no local stack: PostgreSQL restart not injected")
    # commit_probe: every COMMIT sleeps 0.25 s in a deferred trigger; write_sleep: transactions
    # stay open 0.1 s after the write: both windows are where the terminations aim
    plan = FaultPlan(seed=ctx.seed, write_sleep_s=0.1, commit_probe=True)
    mpp = max(100, messages // parts // 12)
    _supervise(
        ctx,
        result,
        name="F3",
        job=job,
        schema=schema,
        topics=[topic],
        ends=log.ends,
        mpp=mpp,
        plan=plan,
        events=events,
    )
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F3")
    return result


@scenario("F4")
def f4_kafka_restart(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The Kafka broker is stopped and started while the job runs."""
    result = ScenarioResult("F4")
    if ctx.services.stack_dir is None:
        result.fail("F4 needs the local stack (TXN_OFFSETS_STACK_DIR) to restart Kafka")
        return result
    parts = 4
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f4")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    plan = FaultPlan(seed=ctx.seed, write_sleep_s=0.05)
    mpp = max(100, messages // parts // 10)
    _supervise(
        ctx,
        result,
        name="F4",
        job=job,
        schema=schema,
        topics=[topic],
        ends=log.ends,
        mpp=mpp,
        plan=plan,
        events=["restart_kafka"],
    )
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F4")
    return result


# --- F5 ------------------------------------------------------------------------------------
@scenario("F5")
def f5_zombie(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """An older run is left running while a new run of the same job starts (--force): the old
    one must be fenced, with nothing of its in-flight work applied twice."""
    result = ScenarioResult("F5")
    parts = 4
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f5")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    mpp = max(100, messages // parts // 10)
    slow = FaultPlan(seed=ctx.seed, write_sleep_s=0.3)
    old = ctx.job(
        ctx.work_dir / "F5" / "old",
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=mpp,
        faults=slow,
        extra=["--follow"],
    ).start()
    result.runs += 1
    _wait_file(ctx.work_dir / "F5" / "old" / "batches", old, 120)
    new = ctx.job(
        ctx.work_dir / "F5" / "new",
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=mpp,
        extra=["--follow", "--force"],
    ).start()
    result.runs += 1
    result.faults += 1
    old_res = old.wait(180)
    if old_res.returncode != 1 or "Fenced" not in old_res.last_error():
        result.fail(f"F5: the zombie was not fenced: exit {old_res.returncode} {old_res.last_error()!r}")
    caught_up = ctx.wait_caught_up(new, schema, job, log.ends, 300)
    new.terminate()
    _expect_ok(result, new.wait(120), "F5 new run")
    if not caught_up:
        result.fail("F5: the new run never caught up")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F5")
    return result


# --- F6 ------------------------------------------------------------------------------------
@scenario("F6")
def f6_speculation(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """spark.speculation on with an aggressive quantile/multiplier, and stragglers to speculate."""
    result = ScenarioResult("F6")
    parts = 8
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f6")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    _producer_matches(result, log, oracle)
    plan = FaultPlan(seed=ctx.seed, straggler_rate=0.3, straggler_s=3.0)
    mpp = max(100, messages // parts // 4)
    # Spark never runs a speculative copy on the host of the original attempt: a standalone
    # cluster whose two workers have distinct loopback addresses gives it a second host.
    attempts = ctx.work_dir / "F6" / "attempts.log"
    attempts.parent.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(REPO), "CHAOS_ATTEMPTS_LOG": str(attempts)}
    with StandaloneCluster(
        ctx.work_dir / "F6" / "spark", workers=2, worker_hosts=["127.0.0.2", "127.0.0.3"], env=env
    ) as master:
        res = (
            ctx.job(
                ctx.work_dir / "F6",
                job=job,
                schema=schema,
                topics=[topic],
                max_per_partition=mpp,
                faults=plan,
                extra=["--speculation", "--master", master],
                env={"CHAOS_ATTEMPTS_LOG": str(attempts)},
            )
            .start()
            .wait(JOB_TIMEOUT_S)
        )
    result.runs += 1
    _expect_ok(result, res, "F6 run")
    lines = attempts.read_text().split("\n") if attempts.exists() else []
    copies = {tuple(line.split()[:3]) for line in lines if line.strip() and line.split()[3] != "0"}
    result.faults = len(copies)
    result.notes.append(f"ranges with a speculative copy={len(copies)} (standalone, 2 worker hosts)")
    if result.faults == 0:
        result.fail("F6: Spark launched no speculative copy, so duplicate attempts were not exercised")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F6")
    return result


# --- F7 ------------------------------------------------------------------------------------
@scenario("F7")
def f7_retention(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """Unprocessed records deleted (delete_records): the default policy fails with DataLoss and
    changes nothing; on_data_loss=skip continues from the log start and audits the skip."""
    result = ScenarioResult("F7")
    parts = 2
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f7")
    first = ctx.produce(topic, messages // 2, parts)
    run = ctx.job(
        ctx.work_dir / "F7" / "first", job=job, schema=schema, topics=[topic], max_per_partition=10**6
    )
    _expect_ok(result, run.start().wait(JOB_TIMEOUT_S), "F7 first run")
    second = ctx.produce(topic, messages - messages // 2, parts)
    result.messages = first.messages + second.messages
    log = ctx.log({topic: parts})  # before the deletion: the oracle of what was produced
    _producer_matches(result, log, first, second)
    stored = ctx.stored(schema, job)
    tp = (topic, 0)
    cut = stored[tp] + max(1, (log.ends[tp] - stored[tp]) // 3)
    for fut in ctx.admin.delete_records([KTopicPartition(topic, 0, cut)]).values():
        fut.result(30)
    result.faults += 1
    before = _snapshot(ctx, schema, job)
    res = (
        ctx.job(ctx.work_dir / "F7" / "fail", job=job, schema=schema, topics=[topic], max_per_partition=10**6)
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 2
    if res.returncode != 1 or "DataLoss" not in res.last_error() or f"{topic}[0]" not in res.last_error():
        result.fail(f"F7: default policy did not fail with DataLoss: {res.returncode} {res.last_error()!r}")
    if _snapshot(ctx, schema, job) != before:
        result.fail("F7: the failed run changed offsets or results")
    res = (
        ctx.job(
            ctx.work_dir / "F7" / "skip",
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=10**6,
            extra=["--on-data-loss", "skip"],
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    _expect_ok(result, res, "F7 skip run")
    ctx.check(
        result, schema=schema, job=job, log=log, final=True, when="F7", excluded={tp: [(stored[tp], cut)]}
    )
    with ctx.engine.connect() as conn:
        skips = conn.execute(
            sa.text(f"SELECT old_off, new_off FROM \"{schema}\".offset_audit WHERE action = 'data_loss_skip'")
        ).all()
    if [tuple(s) for s in skips] != [(stored[tp], cut)]:
        result.fail(f"F7: audit of the skip is {skips}, expected [({stored[tp]}, {cut})]")
    lost = log.count_between(tp, stored[tp], cut)
    result.notes.append(f"{lost} records deleted before processing, skipped with an audit row")
    return result


def _snapshot(ctx: Context, schema: str, job: str) -> tuple[object, ...]:
    with ctx.engine.connect() as conn:
        counts = conn.execute(sa.text(f'SELECT topic, k, n FROM "{schema}".chaos_counts ORDER BY 1, 2')).all()
        history = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".chaos_offset_history')).scalar()
    return (ctx.stored(schema, job), [tuple(r) for r in counts], history)


# --- F8 ------------------------------------------------------------------------------------
@scenario("F8")
def f8_partitions_added(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """Partitions are added to the topic while the job runs; the new ones are read from offset 0."""
    result = ScenarioResult("F8")
    topic, schema, job = ctx.topic(2), ctx.schema(), ctx.name("f8")
    first = ctx.produce(topic, messages // 2, 2)
    mpp = max(100, messages // 2 // 2 // 6)
    run_dir = ctx.work_dir / "F8"
    jp = ctx.job(
        run_dir,
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=mpp,
        faults=FaultPlan(seed=ctx.seed, write_sleep_s=0.05),
        extra=["--follow"],
    ).start()
    result.runs += 1
    _wait_file(run_dir / "batches", jp, 120)
    ctx.admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    result.faults += 1
    second = ctx.produce(topic, messages - messages // 2, 4)
    result.messages = first.messages + second.messages
    log = ctx.log({topic: 4})
    _producer_matches(result, log, first, second)
    caught_up = ctx.wait_caught_up(jp, schema, job, log.ends, 300)
    jp.terminate()
    _expect_ok(result, jp.wait(120), "F8 run")
    if not caught_up:
        result.fail("F8: the job never caught up with the added partitions")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F8")
    return result


# --- F9 ------------------------------------------------------------------------------------
@scenario("F9")
def f9_poison(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """A record the decoder cannot read: the batch fails with RecordRejected naming the record,
    and nothing of its range is written (default mode; dead-letter mode is not exercised here)."""
    result = ScenarioResult("F9")
    parts = 2
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f9")
    first = ctx.produce(topic, messages // 2, parts)
    producer = Producer({"bootstrap.servers": ctx.services.kafka_bootstrap})
    producer.produce(topic, key=b"poison", value=b"{not json", partition=1)
    producer.flush(30)
    poison = read_log(ctx.services.kafka_bootstrap, {topic: parts}).ends[(topic, 1)] - 1
    second = ctx.produce(topic, messages - messages // 2, parts)
    result.messages = first.messages + second.messages
    result.faults += 1
    log = ctx.log({topic: parts})
    res = (
        ctx.job(
            ctx.work_dir / "F9",
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=max(100, messages // 8),
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    want = f"RecordRejected: record {topic}[1]@{poison} was rejected"
    if res.returncode != 1 or want not in res.last_error():
        result.fail(f"F9: expected {want!r}, got exit {res.returncode} {res.last_error()!r}")
    stored = ctx.stored(schema, job)
    if stored.get((topic, 1), 0) > poison:
        result.fail(f"F9: the offset of {topic}[1] moved past the poison record ({stored})")
    # consistency below the stored offsets (the poison record itself is never counted)
    ctx.check(result, schema=schema, job=job, log=log, final=False, when="F9")
    return result


# --- F10 -----------------------------------------------------------------------------------
@scenario("F10")
def f10_compacted(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """A compacted topic (aborted transactions are in every other scenario): the job counts what
    compaction left, exactly once."""
    result = ScenarioResult("F10")
    parts = 2
    topic = ctx.topic(
        parts,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
        },
    )
    schema, job = ctx.schema(), ctx.name("f10")
    producer = Producer({"bootstrap.servers": ctx.services.kafka_bootstrap, "linger.ms": 5})
    rounds, keys = 10, max(10, messages // 10)
    for r in range(rounds):
        for k in range(keys):
            user = f"user-{k}"
            value = json.dumps({"u": user, "p": "/c", "t": r, "d": 1})
            producer.produce(topic, key=user.encode(), value=value.encode(), partition=k % parts)
        producer.flush(30)
        time.sleep(0.15)
    result.messages = rounds * keys
    # wait until the cleaner has run and the log is stable (two equal reads)
    deadline = time.monotonic() + 90
    log = ctx.log({topic: parts})
    previous = -1
    while time.monotonic() < deadline and (log.records == result.messages or log.records != previous):
        time.sleep(2)
        previous, log = log.records, ctx.log({topic: parts})
    result.faults += 1
    result.notes.append(f"compaction left {log.records} of {result.messages} records")
    if log.records == result.messages:
        result.notes.append("the cleaner did not compact within 90 s")
    res = (
        ctx.job(
            ctx.work_dir / "F10", job=job, schema=schema, topics=[topic], max_per_partition=max(100, keys)
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    _expect_ok(result, res, "F10 run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F10")
    return result


# --- F11 -----------------------------------------------------------------------------------
@scenario("F11")
def f11_bad_config(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """Bad configuration fails before any write, with a clear error that never shows a secret."""
    result = ScenarioResult("F11")
    topic, schema = ctx.topic(2), ctx.schema()
    oracle = ctx.produce(topic, max(1000, messages), 2)
    result.messages = oracle.messages
    url = sa.engine.make_url(ctx.services.database_url)
    real_password = str(url.password or "")
    wrong_password = secrets.token_urlsafe(16)
    with socket.socket() as s:  # a port nobody listens on (loopback)
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    broken_schema = ctx.schema()
    with ctx.engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{broken_schema}".offsets CASCADE'))

    def bad_url(**parts: object) -> str:
        return url.set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]

    cases: list[tuple[str, dict[str, str], list[str], str, str]] = [
        # (name, env, extra args, expected error type, expected words)
        (
            "wrong password",
            {"CHAOS_DB": bad_url(password=wrong_password)},
            [],
            "ServiceUnavailable",
            "password authentication failed",
        ),
        ("wrong host", {"CHAOS_DB": bad_url(host="127.0.0.2")}, [], "ServiceUnavailable", "127.0.0.2"),
        ("wrong port", {"CHAOS_DB": bad_url(port=free_port)}, [], "ServiceUnavailable", str(free_port)),
        ("no database URL", {"CHAOS_DB": ""}, [], "ConfigError", "database_url"),
        ("missing schema", {}, ["--schema", "chaos_missing_schema"], "SchemaMissing", "chaos_missing_schema"),
        ("missing table", {}, ["--schema", broken_schema], "SchemaMissing", broken_schema),
        ("missing topic", {}, ["--topics", "chaos-no-such-topic"], "ConfigError", "chaos-no-such-topic"),
        ("bad limits", {}, ["--max-per-partition", "0"], "ConfigError", "max_records_per_partition"),
        ("bad data-loss policy", {}, ["--on-data-loss", "ignore"], "ConfigError", "on_data_loss"),
    ]
    before = _snapshot(ctx, schema, "f11")
    for i, (name, env, extra, kind, words) in enumerate(cases):
        job = f"f11-{i}"
        args = ["--database-url-env", "CHAOS_DB"] if "CHAOS_DB" in env else []
        jp = ctx.job(
            ctx.work_dir / "F11" / f"case-{i}",
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=1000,
            extra=[*args, *extra],
            env=env,
        )
        # argparse keeps the last value of a repeated option: the case's --schema/--topics win
        res = jp.start().wait(120)
        result.runs += 1
        result.faults += 1
        error = res.last_error()
        if res.returncode != 1 or f"chaos-job: {kind}:" not in error or words not in error:
            result.fail(f"F11 {name}: expected {kind} naming {words!r}, got exit {res.returncode}: {error!r}")
        for secret in (real_password, wrong_password):
            if secret and secret in res.log:
                result.fail(f"F11 {name}: the log shows a password")
        if res.seconds > 60:
            result.fail(f"F11 {name}: took {res.seconds:.0f}s to fail")
    if _snapshot(ctx, schema, "f11") != before:
        result.fail("F11: a failed run changed offsets or results")
    with ctx.engine.connect() as conn:
        jobs = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".jobs')).scalar_one()
        rows = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".offsets')).scalar_one()
    if rows:
        result.fail(f"F11: {rows} offset rows were written by failing runs")
    if jobs:
        result.notes.append(
            f"{jobs} job rows (run bookkeeping, no offsets) left by runs that failed in planning"
        )
    return result


def new_job_id() -> str:
    return uuid.uuid4().hex[:10]
