"""Service faults: PostgreSQL connections terminated and the server restarted (F3), Kafka
restarted (F4), while the job runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import sqlalchemy as sa

from chaos.faults import FaultPlan
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    Context,
    app_name,
    expect_ok,
    producer_matches,
    scenario,
    wait_file,
)

logger = logging.getLogger(__name__)


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
        wait_file(run_dir / "batches", jp, 120)
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
                hit = _terminate(ctx, app_name(job), event)
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
            expect_ok(result, res, f"{name} last run")
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
    producer_matches(result, log, oracle)
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
    producer_matches(result, log, oracle)
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
