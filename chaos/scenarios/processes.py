"""Process faults: the driver killed (F1), executors failing (F2), a zombie run (F5), speculative
copies (F6), an executor frozen while it holds a claim (F13).
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import replace
from pathlib import Path

import sqlalchemy as sa

from chaos.faults import (
    EXECUTOR_POINTS,
    KILL_POINTS,
    FaultPlan,
    Fired,
    Key,
    after_commit_calls,
    fired_faults,
    frozen_workers,
    tables,
)
from chaos.invariants import KafkaLog
from chaos.procs import REPO, JobResult, kill_if_alive
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
    and every job is checked; the kill point 'plan' is left out (a shared plan is not the runner's
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
    crash), after the write, or after COMMIT; Spark retries it (local[2,3]).

    One range per Spark task (``--max-tasks``): sharing a task, a range drawn for ``after_commit``
    never fired when an earlier point of another range of the task (or its own first record's
    ``before_write``) failed the attempt first - seed 31376 in the full suite drew three and fired
    none. The first range of five partitions (seeded) is forced to fail at one point each, so every
    point fires whatever the seed and the data; the workers log what fired and every after_commit
    call. A task failing after its COMMIT is recovered by Spark's own retry of that task, which
    finds its range committed already (``already_committed``); the batch does not fail and is not
    planned again. Checked per fault: the range was committed once (one commits row, one applied
    row), and the retry reported exactly it already_committed."""
    result = ScenarioResult("F2")
    parts = 8
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f2")
    oracle = ctx.produce(topic, messages, parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    producer_matches(result, log, oracle)
    mpp = max(100, messages // parts // 5)
    run_dir = ctx.work_dir / "F2"
    plan = FaultPlan(
        seed=ctx.seed,
        # with one range per task every drawn fault fires (each a Python worker's restart): 0.3 keeps
        # F2's count near what it was (~12-15); the forced ranges still hit every point on every seed
        # (the smoke fires only those five: every further fault is one more worker restart)
        executor_rate=0.3 if ctx.drawn_faults else 0.0,
        executor_points=EXECUTOR_POINTS,
        forced=_forced_faults(ctx.seed, log, topic, parts, mpp),
        record=True,
        run_dir=str(run_dir),
    )
    jp = ctx.job(
        run_dir,
        job=job,
        schema=schema,
        topics=[topic],
        max_per_partition=mpp,
        faults=plan,
        extra=["--max-tasks", str(parts)],  # a batch has at most one range per partition
    )
    res = jp.start().wait(JOB_TIMEOUT_S)
    result.runs += 1
    expect_ok(result, res, "F2 run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F2")
    fired = fired_faults(run_dir)
    hits: dict[str, int] = dict.fromkeys(EXECUTOR_POINTS, 0)
    for f in fired:
        hits[f.point] += 1
    result.faults = len(fired)
    result.notes.append(", ".join(f"{k}={v}" for k, v in hits.items()))
    missing = [k for k, v in hits.items() if v == 0]
    if missing:
        result.fail(f"F2: no fault at {missing} (forced on a first range each: see {run_dir / 'faults'})")
    if any(f.attempt != 0 for f in fired):
        result.fail(f"F2: a fault fired on a retry: {[f for f in fired if f.attempt != 0][:3]}")
    # every drawn fault of an applied range fired, and nothing else did: one range per task
    drawn = _drawn_faults(ctx, schema, plan, log)
    got = {(f.point, f.key) for f in fired}
    if got != drawn:
        result.fail(
            f"F2: faults drawn but not fired {sorted(drawn - got)[:3]}, fired but not drawn "
            f"{sorted(got - drawn)[:3]} (a task's earlier fault ended its attempt first?)"
        )
    _check_after_commit(result, ctx, schema=schema, job=job, fired=fired, res=res, run_dir=run_dir)
    return result


def _forced_faults(
    seed: int, log: KafkaLog, topic: str, parts: int, mpp: int
) -> tuple[tuple[str, int, int, int, str], ...]:
    """F2: the first range of five partitions (seeded, of those whose first range holds a visible
    record) fails at one executor point each: (topic, partition, start, first record, point)."""
    rng = random.Random(f"{seed}:F2:forced")  # not ctx.rng: the scenarios after F2 keep their names
    firsts = {}
    for p in range(parts):
        start = log.starts.get((topic, p), 0)
        offs = log.offsets.get((topic, p))
        if offs and offs[0] < start + mpp:  # the first range is [start, start + mpp) at most
            firsts[p] = (start, offs[0])
    chosen = rng.sample(sorted(firsts), min(len(EXECUTOR_POINTS), len(firsts)))
    points = list(EXECUTOR_POINTS)
    rng.shuffle(points)
    return tuple((topic, p, *firsts[p], point) for p, point in zip(chosen, points, strict=False))


def _drawn_faults(ctx: Context, schema: str, plan: FaultPlan, log: KafkaLog) -> set[tuple[str, Key]]:
    """The (point, key) of the fault each applied range draws for its first attempt: before_write
    is keyed by the range's first record (and ends the attempt before any other point), the other
    points by the range's start."""
    t = tables(schema).applied
    with ctx.engine.connect() as conn:
        applied = conn.execute(sa.select(t.c.topic, t.c.part, t.c.start_off, t.c.until_off)).all()
    out: set[tuple[str, Key]] = set()
    for topic, part, start, until in applied:
        first = _first_offset(log, (topic, part), int(start))
        if first is not None and first < until:
            key = (topic, int(part), first)
            if plan.executor_point(key) == "before_write":
                out.add(("before_write", key))
                continue
        key = (topic, int(part), int(start))
        point = plan.executor_point(key)
        if point is not None and point != "before_write":
            out.add((point, key))
    return out


def _check_after_commit(
    result: ScenarioResult,
    ctx: Context,
    *,
    schema: str,
    job: str,
    fired: list[Fired],
    res: JobResult,
    run_dir: Path,
) -> None:
    """Each after_commit fault fired after its range's COMMIT (the hook saw 'committed' on attempt
    0), Spark's retry of the task found exactly that range committed already ('already_committed'
    on attempt >= 1), the range has one commits row and one applied row, and the job's summary
    counts one already_committed per fault: the retry path, not a failed batch planned again."""
    faults = [f.key for f in fired if f.point == "after_commit"]
    calls = after_commit_calls(run_dir)
    replans = res.log.count("transient failure")
    why = f" (the runner planned again {replans} times: a batch failed, no task retry)" if replans else ""
    already = {c.key for c in calls if c.outcome == "already_committed"}
    if already != set(faults):
        result.fail(
            f"F2: ranges reported already_committed {sorted(already)[:3]} != ranges failed after "
            f"COMMIT {sorted(faults)[:3]}{why}"
        )
    t = tables(schema).applied
    s = f'"{schema}"'
    with ctx.engine.connect() as conn:
        for key in faults:
            mine = [c for c in calls if c.key == key]
            if not any(c.outcome == "committed" and c.attempt == 0 for c in mine):
                result.fail(f"F2: after_commit fault of {key} fired without a COMMIT on attempt 0")
            if not any(c.outcome == "already_committed" and c.attempt >= 1 for c in mine):
                result.fail(f"F2: after_commit fault of {key}: no retry reported already_committed{why}")
            lineage = conn.execute(
                sa.text(
                    f"SELECT until_off FROM {s}.commits WHERE job = :j AND topic = :t AND part = :p "
                    "AND from_off = :f"
                ),
                {"j": job, "t": key[0], "p": key[1], "f": key[2]},
            ).all()
            rows = conn.execute(
                sa.select(sa.func.count()).where(
                    t.c.topic == key[0], t.c.part == key[1], t.c.start_off == key[2]
                )
            ).scalar_one()
            until = {c.until for c in mine}
            if len(lineage) != 1 or rows != 1 or {int(r.until_off) for r in lineage} != until:
                result.fail(
                    f"F2: after_commit fault of {key}: {len(lineage)} commits rows (until "
                    f"{sorted(int(r.until_off) for r in lineage)}, hook saw {sorted(until)}), "
                    f"{rows} applied rows; expected one of each"
                )
    found = re.search(r"already_committed=(\d+) ", res.last_error())
    summary = int(found.group(1)) if found else -1
    if summary != len(faults):
        result.fail(
            f"F2: the job reported already_committed={summary}, {len(faults)} after_commit faults fired{why}"
        )
    result.notes.append(
        f"after_commit: {len(faults)} fired after COMMIT, {len(already & set(faults))} found already "
        f"committed by Spark's task retry, {replans} re-plans"
    )


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
