"""Scale faults (issue 24): F1b, F1's driver kills on a topic of 1,024 partitions; F19, a driver
running many jobs in shared rounds killed.

F1b: every batch is about a thousand ranges, so a kill lands with hundreds of claims in flight, some
committed and some not, spread over the Spark tasks: each restart must plan from exactly what was
committed (I1-I3 after every kill, lost=0 duplicated=0 at the end). Full suite only: a run at 1,024
partitions takes tens of seconds per restart, more than the smoke's budget in ``make test``.

F19: ``run_jobs`` runs :data:`JOBS` jobs (each on a topic of its own, all in one schema) in shared
rounds, where a round task commits its jobs' ranges in ONE transaction (``store/joint_commit.py``).
The driver is killed -9 at seeded points - while a range is read, after a unit's claim inside the
joint transaction, just before its COMMIT, after it, or by a timer - and Python workers crash
(``os._exit``) after a claim on a round task's first attempt, so Spark retries the round task with
the joint transaction rolled back. Each kill is followed by a restart of all the jobs (--force);
every job is checked (I1-I3, lineage) after every kill and at the end. Full suite only.
"""

from __future__ import annotations

import time
from dataclasses import replace

from chaos.faults import KILL_POINTS, FaultPlan
from chaos.report import ScenarioResult
from chaos.scenarios.context import JOB_TIMEOUT_S, Context, expect_ok, producer_matches, scenario, wait_file
from chaos.scenarios.processes import driver_kills

PARTITIONS = 1_024
KILLS = 3  # at most: each restart is a new JVM and ~1,000 ranges per batch
JOBS = 4  # F19: jobs sharing the driver, the rounds and the schema
JOB_KILLS = 5  # F19: at most; one per kill point (timer, read, after_claim, commit, after_commit)
JOB_PARTITIONS = 4  # F19: each job's topic
CRASH_RATE = 0.1  # F19: ranges whose round task's first attempt loses its Python worker after the claim


@scenario("F1b")
def f1b_driver_kills_many_partitions(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of the driver at F1's seeded points on 1,024 partitions, each followed by a restart."""
    # a few records per partition per batch: several batches of ~1,000 ranges per run
    return driver_kills(
        ctx,
        "F1b",
        messages,
        min(kills, KILLS),
        parts=PARTITIONS,
        min_per_partition=5,
        first_batch_s=240.0,
        # the page views are skewed (a partition holds up to ~15 % of the records): a small cap
        # would take hundreds of batches to catch up, so the final run reads it all at once
        final_per_partition=messages,
    )


@scenario("F19")
def f19_many_jobs_driver_kills(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of a driver running JOBS jobs in shared rounds (joint commits), worker crashes inside
    the joint transaction; a restart of every job after each kill."""
    result = ScenarioResult("F19")
    kills = min(kills, JOB_KILLS)
    schema, base = ctx.schema(), ctx.name("f19")
    topics = [ctx.topic(JOB_PARTITIONS) for _ in range(JOBS)]
    jobs = [f"{base}-{i}" for i in range(JOBS)]  # chaos.job --many names them so
    oracles = [ctx.produce(t, max(1, messages // JOBS), JOB_PARTITIONS) for t in topics]
    result.messages = sum(o.messages for o in oracles)
    logs = [ctx.log({t: JOB_PARTITIONS}) for t in topics]
    for log, oracle in zip(logs, oracles, strict=True):
        producer_matches(result, log, oracle)
    # small batches: each killed run gets through a few rounds, and `kills` runs fit in the data
    mpp = max(20, messages // JOBS // JOB_PARTITIONS // (3 * kills + 4))
    modes = [m for m in KILL_POINTS if m != "plan"]  # a joint plan is not runner.plan_batch
    ctx.rng.shuffle(modes)

    def check(final: bool, when: str) -> None:
        for job, log in zip(jobs, logs, strict=True):
            ctx.check(result, schema=schema, job=job, log=log, final=final, when=f"{when}: {job}")

    attempts = 0
    while result.faults < kills and attempts < kills * 2:
        attempts += 1
        mode = modes[result.faults % len(modes)]
        run_dir = ctx.work_dir / "F19" / f"run-{attempts:03d}"
        plan = FaultPlan(seed=ctx.seed, executor_rate=CRASH_RATE, executor_points=("crash_after_claim",))
        if mode != "timer":
            after = ctx.rng.randint(1, 3 * JOBS * JOB_PARTITIONS)
            plan = replace(plan, kill_point=mode, kill_after=after, run_dir=str(run_dir))
        jp = ctx.job(
            run_dir,
            job=base,
            schema=schema,
            topics=topics,
            max_per_partition=mpp,
            faults=plan,
            extra=["--force", "--many"],
        ).start()
        result.runs += 1
        if mode == "timer":
            wait_file(run_dir / "batches", jp, 120.0)  # after a first batch committed
            time.sleep(ctx.rng.uniform(0.0, 1.0))
            jp.kill9()
        res = jp.wait(JOB_TIMEOUT_S)
        if res.killed:
            result.faults += 1
        elif res.returncode == 0:
            result.notes.append(f"run {attempts} ({mode}) caught up before its kill")
            break
        else:
            result.fail(f"F19 run {attempts} ({mode}): exited {res.returncode}: {res.last_error()}")
        check(False, f"after kill {attempts} ({mode})")
    final = ctx.job(
        ctx.work_dir / "F19" / "final",
        job=base,
        schema=schema,
        topics=topics,
        max_per_partition=mpp * 4,
        extra=["--force", "--many"],
    ).start()
    result.runs += 1
    expect_ok(result, final.wait(JOB_TIMEOUT_S), "F19 final run")
    check(True, "F19 final")
    if result.faults < kills:
        result.fail(f"F19: only {result.faults} of {kills} kills landed")
    return result
