"""User-code faults: a ``write`` that swallows a database error (F14)."""

from __future__ import annotations

import logging

from chaos.faults import FaultPlan
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    JOB_TIMEOUT_S,
    Context,
    changed,
    expect_ok,
    producer_matches,
    scenario,
    snapshot,
)

logger = logging.getLogger(__name__)

F14_BOUND_S = 120.0  # the failing run, Spark start included: a job that loops is killed and fails F14


# --- F14 -----------------------------------------------------------------------------------
@scenario("F14")
def f14_swallowed_db_error(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The user's write runs a failing statement (``SELECT 1/0``) inside the range's transaction,
    catches the error and returns normally. PostgreSQL has aborted the transaction, so its COMMIT
    is a silent ROLLBACK: the job must fail with TransactionAborted instead of reporting the range
    committed (or planning it again forever), and nothing may move."""
    result = ScenarioResult("F14")
    parts = 2
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f14")
    first = ctx.produce(topic, messages // 2, parts)
    # a clean run first: the job then has offsets and results that the faulty run must not move
    res = (
        ctx.job(
            ctx.work_dir / "F14" / "first", job=job, schema=schema, topics=[topic], max_per_partition=10**6
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    expect_ok(result, res, "F14 first run")
    second = ctx.produce(topic, messages - messages // 2, parts)
    result.messages = first.messages + second.messages
    log = ctx.log({topic: parts})
    producer_matches(result, log, first, second)
    before = snapshot(ctx, schema, job)
    res = (
        ctx.job(
            ctx.work_dir / "F14" / "swallow",
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=10**6,
            faults=FaultPlan(seed=ctx.seed, swallow_db_error=True),
        )
        .start()
        .wait(F14_BOUND_S)
    )
    result.runs += 1
    result.faults += 1
    if res.returncode != 1 or "chaos-job: TransactionAborted:" not in res.last_error():
        result.fail(
            f"F14: a swallowed database error did not fail the job with TransactionAborted: "
            f"exit {res.returncode} {res.last_error() or res.log[-300:]!r}"
        )
    if diff := changed(before, snapshot(ctx, schema, job)):
        result.fail(f"F14: the failed run changed {', '.join(diff)}")
    ctx.check(result, schema=schema, job=job, log=log, final=False, when="F14 after the failed run")
    # the same job without the bad write catches up: nothing of the failed run is missing or doubled
    res_clean = (
        ctx.job(
            ctx.work_dir / "F14" / "final", job=job, schema=schema, topics=[topic], max_per_partition=10**6
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    expect_ok(result, res_clean, "F14 final run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F14 final")
    result.notes.append(f"the failing run ended in {res.seconds:.0f}s: {res.last_error()[:120]}")
    return result
