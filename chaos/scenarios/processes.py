"""Process faults: the driver killed (F1), executors failing (F2), a zombie run (F5), speculative
copies (F6), an executor frozen while it holds a claim (F13).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import sqlalchemy as sa

from chaos.faults import EXECUTOR_POINTS, KILL_POINTS, FaultPlan, frozen_workers, tables
from chaos.invariants import KafkaLog
from chaos.procs import REPO, kill_if_alive
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    JOB_TIMEOUT_S,
    Context,
    expect_ok,
    producer_matches,
    scenario,
    wait_file,
)
from txn_offsets.devstack.cluster import StandaloneCluster

logger = logging.getLogger(__name__)


# --- F1 ------------------------------------------------------------------------------------
@scenario("F1")
def f1_driver_kills(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of the driver at random points (timer, after planning, while reading, after the
    claim, during COMMIT, after COMMIT), each followed by a restart (--force: the dead run's lease
    is still live)."""
    return driver_kills(ctx, "F1", messages, kills, parts=8, min_per_partition=100)


def driver_kills(
    ctx: Context,
    name: str,
    messages: int,
    kills: int,
    *,
    parts: int,
    min_per_partition: int,
    first_batch_s: float = 120.0,
    final_per_partition: int | None = None,
    jobs: int = 1,
    crash_rate: float = 0.0,
) -> ScenarioResult:
    """F1's kills and restarts on a topic of `parts` partitions (F1b: 1,024); a timer kill waits
    up to `first_batch_s` for the run's first batch; the final run reads `final_per_partition`
    offsets per partition and batch (default: 4 x the killed runs').

    With `jobs` > 1 (F19) the driver runs that many jobs with ``run_jobs`` in shared rounds
    (``chaos.job --many``), each on a topic of `parts` partitions of its own, all in one schema,
    and every job is checked; the kill point 'plan' is left out (a joint plan is not the runner's
    plan_batch). `crash_rate`: the share of ranges (seeded) whose Python worker crashes after the
    claim on a task's first attempt, so Spark retries the task (in shared rounds: the whole round
    task, its joint transaction rolled back)."""
    result = ScenarioResult(name)
    topics = [ctx.topic(parts) for _ in range(jobs)]
    schema, base = ctx.schema(), ctx.name(name.lower())
    names = [base] if jobs == 1 else [f"{base}-{i}" for i in range(jobs)]  # as chaos.job --many names them
    oracles = [ctx.produce(topic, messages // jobs, parts) for topic in topics]
    result.messages = sum(o.messages for o in oracles)
    logs = [ctx.log({topic: parts}) for topic in topics]
    for log, oracle in zip(logs, oracles, strict=True):
        producer_matches(result, log, oracle)
    # small batches: each killed run gets through a few of them, and `kills` runs fit in the data
    mpp = max(min_per_partition, messages // jobs // parts // (3 * kills + 4))
    modes = [m for m in KILL_POINTS if jobs == 1 or m != "plan"]
    extra = ["--force"] if jobs == 1 else ["--force", "--many"]

    def check(final: bool, when: str) -> None:
        for job, log in zip(names, logs, strict=True):
            where = when if jobs == 1 else f"{when}: {job}"
            ctx.check(result, schema=schema, job=job, log=log, final=final, when=where)

    ctx.rng.shuffle(modes)
    attempts = 0
    while result.faults < kills and attempts < kills * 2:
        attempts += 1
        mode = modes[result.faults % len(modes)]
        run_dir = ctx.work_dir / name / f"run-{attempts:03d}"
        points = ("crash_after_claim",) if crash_rate else ()
        plan = FaultPlan(seed=ctx.seed, executor_rate=crash_rate, executor_points=points)
        run_extra = list(extra)
        if mode == "plan":
            run_extra += ["--kill-at-plan", str(ctx.rng.randint(1, 3))]
        elif mode != "timer":
            after = ctx.rng.randint(1, 2 * parts * jobs)
            plan = replace(plan, kill_point=mode, kill_after=after, run_dir=str(run_dir))
        jp = ctx.job(
            run_dir,
            job=base,
            schema=schema,
            topics=topics,
            max_per_partition=mpp,
            faults=plan,
            extra=run_extra,
        ).start()
        result.runs += 1
        if mode == "timer":
            # after the first batch committed: the kill lands anywhere in the following ones
            wait_file(run_dir / "batches", jp, first_batch_s)
            time.sleep(ctx.rng.uniform(0.0, 0.5))  # batches take ~0.2 s: a longer wait spends the data
            jp.kill9()
        res = jp.wait(JOB_TIMEOUT_S)
        if res.killed:
            result.faults += 1
        elif res.returncode == 0:
            result.notes.append(f"run {attempts} ({mode}) caught up before its kill")
            break
        else:
            result.fail(f"{name} run {attempts} ({mode}): exited {res.returncode}: {res.last_error()}")
        check(False, f"after kill {attempts} ({mode})")
    final = ctx.job(
        ctx.work_dir / name / "final",
        job=base,
        schema=schema,
        topics=topics,
        max_per_partition=final_per_partition or mpp * 4,
        extra=extra,
    ).start()
    result.runs += 1
    expect_ok(result, final.wait(JOB_TIMEOUT_S), f"{name} final run")
    check(True, f"{name} final")
    if result.faults < kills:
        result.fail(f"{name}: only {result.faults} of {kills} kills landed")
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
    producer_matches(result, log, oracle)
    plan = FaultPlan(seed=ctx.seed, executor_rate=0.5, executor_points=EXECUTOR_POINTS)
    mpp = max(100, messages // parts // 5)
    jp = ctx.job(
        ctx.work_dir / "F2", job=job, schema=schema, topics=[topic], max_per_partition=mpp, faults=plan
    )
    res = jp.start().wait(JOB_TIMEOUT_S)
    result.runs += 1
    expect_ok(result, res, "F2 run")
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
    producer_matches(result, log, oracle)
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
    wait_file(ctx.work_dir / "F5" / "old" / "batches", old, 120)
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
    expect_ok(result, new.wait(120), "F5 new run")
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
    producer_matches(result, log, oracle)
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
    expect_ok(result, res, "F6 run")
    lines = attempts.read_text().split("\n") if attempts.exists() else []
    copies = {tuple(line.split()[:3]) for line in lines if line.strip() and line.split()[3] != "0"}
    result.faults = len(copies)
    result.notes.append(f"ranges with a speculative copy={len(copies)} (standalone, 2 worker hosts)")
    if result.faults == 0:
        result.fail("F6: Spark launched no speculative copy, so duplicate attempts were not exercised")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F6")
    return result


# --- F13 -----------------------------------------------------------------------------------
F13_BOUND_S = 180.0  # the whole run, Spark start included; a hang fails F13 instead of hanging it


@scenario("F13")
def f13_frozen_claim(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """A Python worker SIGSTOPs itself inside the write, with its range claimed and the transaction
    open (seeded ranges, first attempt only, at most 2 per run). Nothing ever resumes it: PostgreSQL
    must end the idle transaction (idle_in_transaction_timeout_s) so the row lock goes, and the
    runner must cancel the stuck Spark batch (batch_timeout_s) and plan again from the stored
    offsets. The job must finish, in bounded time, with nothing lost or applied twice."""
    result = ScenarioResult("F13")
    parts = 4
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f13")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    producer_matches(result, log, oracle)
    run_dir = ctx.work_dir / "F13"
    plan = FaultPlan(seed=ctx.seed, freeze_after_claim_rate=0.25, freeze_limit=2, run_dir=str(run_dir))
    timeouts = {"batch": 12.0, "lock": 3.0, "idle in transaction": 5.0}
    jp = ctx.job(
        run_dir,
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=max(100, messages // parts // 5),
        faults=plan,
        extra=[
            "--batch-timeout",
            str(timeouts["batch"]),
            "--lock-timeout",
            str(timeouts["lock"]),
            "--idle-in-transaction-timeout",
            str(timeouts["idle in transaction"]),
        ],
    )
    try:
        res = jp.start().wait(F13_BOUND_S)
    finally:
        # a stopped worker must not outlive the scenario (wait() reaps the job's descendants it
        # saw; this catches any it did not)
        left = [pid for pid, start in frozen_workers(run_dir) if kill_if_alive(pid, start)]
    result.runs += 1
    frozen = frozen_workers(run_dir)
    result.faults = len(frozen)
    expect_ok(result, res, "F13 run")
    if res.seconds > F13_BOUND_S:
        result.fail(f"F13: the job took {res.seconds:.0f}s (bound {F13_BOUND_S:.0f}s)")
    if not frozen:
        result.fail("F13: no claim was frozen: use more messages")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F13")
    result.notes.append(
        f"{len(frozen)} worker(s) stopped holding a claim, the run took {res.seconds:.0f}s "
        f"(timeouts: {', '.join(f'{k} {v:g}s' for k, v in timeouts.items())})"
    )
    if left:
        result.notes.append(f"{len(left)} stopped worker(s) still alive after the run, killed")
    return result
