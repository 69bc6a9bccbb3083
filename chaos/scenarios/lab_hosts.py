"""The lab's host faults around the PostgreSQL transaction: a worker host cut off while its task is inside
its transaction (L7: the connection half-open), and a zombie driver across hosts (L8).

L7 reuses L1's machinery (:func:`chaos.scenarios.lab.run_with_fault`) with each range's transaction
held open 2 s in its write (``FaultPlan.write_sleep_s``), so the cut lands inside one: once
PostgreSQL shows a session of the job from worker-2 inside a transaction, worker-2 is cut off (its
switch port disabled: no FIN, no RST, the server's end half-open, the range's offset row locked).
The store's own server-side TCP settings (``DatabaseSettings.tcp_keepalives_*``,
``tcp_user_timeout_s``: :func:`txn_offsets.store.pooler.half_open_s`) end that session; Spark, told
by a short ``spark.network.timeout`` that the executor is gone, runs the task again on worker-1,
whose claim gets the row once the session is gone: it commits the range once or finds it
committed. worker-2 is healed after 45 s (past both bounds), when the cut task's COMMIT meets a dead
connection: the run's checks (no range applied twice, lineage = applied ranges) prove it never
committed. Printed: cut -> the server dropped the session, and the recovery figures.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, expect_ok, new_job_id, producer_matches, scenario
from chaos.scenarios.lab import (
    JOB_TIMEOUT_S,
    PARTITIONS,
    JobMode,
    LabJob,
    Producing,
    batches,
    lab_topic,
    recovery_s,
    run_with_fault,
    start_job,
    the_lab,
    wait_until,
)
from txn_offsets.config import DatabaseSettings
from txn_offsets.devstack.lab import Lab, faults
from txn_offsets.redaction import Secret
from txn_offsets.store.pooler import half_open_s

__all__ = ["HALF_OPEN"]

HOLD_S = 2.0  # each range's transaction open this long in its write
HALF_OPEN_CUT_S = 45.0
#: ranges held open in their write; an executor unheard of for 20 s is lost (Spark's default: 120 s)
HALF_OPEN = JobMode(
    args=("--faults", json.dumps({"write_sleep_s": HOLD_S})),
    name="batch, each transaction held 2 s",
    spark=(
        ("spark.network.timeout", "20s"),
        ("spark.network.timeoutInterval", "5s"),  # the driver's check for lost executors
        ("spark.executor.heartbeatInterval", "2s"),
    ),
)

# the lab job's sessions (application_name chaos-l7-<id>) from a host, inside a transaction
_IN_TRANSACTION = sa.text(
    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'chaos-l7-%' AND xact_start IS NOT NULL"
    " AND client_addr = CAST(:addr AS inet)"
)
_ALIVE = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")


@scenario("L7")
def l7_worker_cut_in_transaction(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    state: dict[str, Any] = {}
    bound = half_open_s(DatabaseSettings(Secret(ctx.services.database_url))) or 0.0

    def cut(lab: Lab, _topic: str, _p: Producing) -> tuple[float, str]:
        addr = lab.net.host("worker-2").address
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with ctx.engine.connect() as conn:
                pids = [p for (p,) in conn.execute(_IN_TRANSACTION, {"addr": addr})]
            if pids:
                at = time.time()
                faults.cut(lab.net, "worker-2")
                state.update(pids=pids, at=time.monotonic())
                return at, f"cut worker-2 inside {len(pids)} transaction(s)"
            time.sleep(0.05)
        raise TimeoutError("no transaction of the job from worker-2 in 120 s")

    def heal(lab: Lab, _topic: str) -> str:
        dropped = None
        while time.monotonic() - state["at"] < HALF_OPEN_CUT_S:
            if dropped is None:
                with ctx.engine.connect() as conn:
                    if not any(conn.execute(_ALIVE, {"pid": p}).scalar_one() for p in state["pids"]):
                        dropped = time.monotonic() - state["at"]
            time.sleep(0.2)
        faults.heal(lab.net, "worker-2")
        when = "not within the cut" if dropped is None else f"{dropped:.1f}s"
        state["dropped"] = dropped
        return f"the server dropped the cut session after {when} (bound {bound:.0f}s); healed at 45s"

    result = run_with_fault(ctx, "L7", messages, leader=1 + ctx.rng.randrange(3), fault=cut, restore=heal,
                            mode=HALF_OPEN)  # fmt: skip
    if state.get("dropped") is None:
        result.fail("L7: the cut transaction's session was not dropped by the server within the cut")
    elif state["dropped"] > bound + 10:
        result.fail(
            f"L7: the server dropped the cut session after {state['dropped']:.1f}s, over {bound:.0f}s"
        )
    return result


# --- L8: a zombie driver across hosts -------------------------------------------------------------
#: one executor (one worker's core) per run: the frozen run's application keeps its own, the new
#: run gets the other worker
ONE_EXECUTOR = JobMode(name="batch, one executor", spark=(("spark.cores.max", "1"),))
TAKEOVER_TIMEOUT_S = 240.0


def generation(ctx: Context, schema: str, job: str) -> int:
    query = sa.text(f'SELECT generation FROM "{schema}".jobs WHERE job = :j')
    with ctx.engine.connect() as conn:
        return int(conn.execute(query, {"j": job}).scalar_one_or_none() or 0)


def commits_of(ctx: Context, schema: str, job: str, gen: int) -> list[dt.datetime]:
    query = sa.text(f'SELECT committed_at FROM "{schema}".commits WHERE job = :j AND generation = :g')
    with ctx.engine.connect() as conn:
        return [r[0] for r in conn.execute(query, {"j": job, "g": gen})]


def take_over(
    ctx: Context, lab: Lab, base: Path, *, job: str, schema: str, topic: str, old_gen: int
) -> tuple[LabJob, int]:
    """The job started again on the driver host, as an orchestrator restarts it: again each time it is
    refused (``JobAlreadyRunning``: the frozen run's lease is live) until it starts a run of its own
    (a newer generation); that job and the number of starts."""
    deadline = time.monotonic() + TAKEOVER_TIMEOUT_S
    starts = 0
    while time.monotonic() < deadline:
        starts += 1
        jp = start_job(
            ctx, lab, base / f"takeover-{starts}", job=job, schema=schema, topic=topic, mode=ONE_EXECUTOR
        )
        while jp.running() and generation(ctx, schema, job) == old_gen:
            time.sleep(0.2)
        if jp.running():
            return jp, starts
        refused = jp.wait(30).last_error()
        if "JobAlreadyRunning" not in refused:
            raise RuntimeError(f"the restarted job failed: {refused or jp.log_path}")
        time.sleep(1.0)
    raise TimeoutError(f"no takeover in {TAKEOVER_TIMEOUT_S:.0f} s")


@scenario("L8")
def l8_zombie_driver(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    """The job runs from driver-2; driver-2 is frozen (every process SIGSTOPped) and cut off; the job
    is restarted on the driver host until the frozen run's lease lets it (a new generation); once the
    new run commits, driver-2 is healed and thawed: the old driver must stop fenced, no commit of its
    generation after the takeover, and the run exact."""
    result = ScenarioResult("L8")
    lab = the_lab()
    topic = lab_topic(ctx, PARTITIONS, 1 + ctx.rng.randrange(3))
    schema, job = ctx.schema(), f"l8-{new_job_id()}"
    first = ctx.produce(topic, messages // 2, PARTITIONS)
    base = ctx.work_dir / "L8" / job
    old = start_job(ctx, lab, base / "zombie", job=job, schema=schema, topic=topic, mode=ONE_EXECUTOR,
                    driver="driver-2")  # fmt: skip
    new: LabJob | None = None
    timeline: list[str] = []
    try:
        wait_until("the first batch", lambda: batches(base / "zombie") >= 1, old, 300)
        old_gen = generation(ctx, schema, job)
        producing = Producing(ctx, topic, messages - messages // 2)
        producing.start()
        time.sleep(1.0)
        fault_at, t0 = time.time(), time.monotonic()
        faults.freeze(lab.net, "driver-2")
        faults.cut(lab.net, "driver-2")
        new, starts = take_over(ctx, lab, base, job=job, schema=schema, topic=topic, old_gen=old_gen)
        took = time.monotonic() - t0
        timeline.append(f"driver-2 frozen+cut at 0s; taken over at {took:.1f}s (start {starts})")
        new_gen = generation(ctx, schema, job)
        wait_until(
            "the new run's first commit", lambda: bool(commits_of(ctx, schema, job, new_gen)), new, 300
        )
        first_new = min(c.timestamp() for c in commits_of(ctx, schema, job, new_gen)) - fault_at
        timeline.append(f"new run's first commit at {first_new:.1f}s")
        faults.heal(lab.net, "driver-2")
        faults.thaw(lab.net, "driver-2")
        thawed = time.monotonic() - t0
        timeline.append(f"driver-2 healed+thawed at {thawed:.1f}s")
        old_res = old.wait(180)
        why = old_res.last_error()[:120] or f"exit {old_res.returncode}"
        timeline.append(f"old driver exited at {time.monotonic() - t0:.1f}s: {why}")
        if "Fenced" not in old_res.last_error():
            result.fail(
                f"L8: the old driver did not stop fenced: {old_res.last_error() or old_res.returncode}"
            )
        producing.join(JOB_TIMEOUT_S)
        if producing.error is not None or producing.oracle is None:
            result.fail(f"the producer failed: {producing.error!r}")
            return result
        log = ctx.log({topic: PARTITIONS})
        if not ctx.wait_caught_up(new, schema, job, dict(log.ends), JOB_TIMEOUT_S):
            result.fail(f"L8: the new run did not catch up to {dict(log.ends)}: {new.log_path}")
        took_over_at = fault_at + took
        late = [c for c in commits_of(ctx, schema, job, old_gen) if c.timestamp() > took_over_at]
        if late:
            result.fail(f"L8: {len(late)} commit(s) of the fenced generation {old_gen} after the takeover")
        timeline.append(f"commits of generation {old_gen} after the takeover: {len(late)}")
    finally:
        for jp in (old, new):
            if jp is not None:
                jp.terminate()
        res = new.wait(120) if new is not None else None
        old.wait(30)
    if res is not None:
        expect_ok(result, res, "L8 new run")
    producer_matches(result, log, first, producing.oracle)
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="L8")
    recovery = recovery_s(fault_at, commits_of(ctx, schema, job, new_gen))
    result.runs, result.faults, result.messages = 1 + starts, 1, log.records
    result.notes += [
        f"recovery={'none' if recovery is None else f'{recovery:.1f}s'} (the new run's first commit)",
        *timeline,
    ]
    return result
