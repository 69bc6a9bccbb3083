"""PostgreSQL failover under load (F15-F17): the job reaches its database through a libpq
multi-host URL (``host=primary,replica``, ``target_session_attrs=read-write``) and must stay exact
when the primary goes away and the replica is promoted.

Each scenario runs its OWN primary and streaming replica (:class:`txn_offsets.devstack.replica.Pair`,
asynchronous replication, free loopback ports, in its work directory): the stack's PostgreSQL, and
so every other scenario and test, is never touched. Promotion is ``pg_ctl promote``: what Patroni
(or a managed service's HA) does as far as clients can tell, without the consensus around it.

* F15 the primary is killed -9 under load (its WAL sender was paused for a second first, so the
  last commits are missing from the new primary: results and offsets together), then the replica
  is promoted. The job re-reads the lost tail from Kafka.
* F16 a planned switchover: the old primary turns read-only (``ALTER SYSTEM SET
  default_transaction_read_only = on`` + reload: clients get SQLSTATE 25006), the replica catches
  up, the old primary stops (57P01), the replica is promoted. Nothing may be lost.
* F17 a COMMIT in flight (a deferred trigger makes each COMMIT take 0.25 s) when the primary dies:
  the old primary is frozen inside that COMMIT (SIGSTOP), the replica promoted, then the old one
  killed; the client's connection drops during COMMIT and the guard's re-read (a fresh connection
  through the multi-host URL) lands on the NEW primary and classifies it.

The recovery time (fault -> first range committed on the new primary) is in each scenario's notes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from chaos.faults import FaultPlan
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    Context,
    Services,
    app_name,
    expect_ok,
    producer_matches,
    scenario,
    wait_file,
)
from txn_offsets.devstack import postgres, replica
from txn_offsets.devstack.replica import Pair

logger = logging.getLogger(__name__)

PARTS = 4


@dataclass
class HA:
    """A scenario's primary+replica pair and a Context whose database is the pair (multi-host)."""

    pair: Pair
    ctx: Context

    def sql(self, node: postgres.PgCluster, query: str, *params: object) -> list[tuple[object, ...]]:
        info = postgres.admin_conninfo(node, self.pair.admin_password, postgres.APP_DB)
        with psycopg.connect(**info, autocommit=True) as conn:  # type: ignore[arg-type]
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def applied(self, node: postgres.PgCluster, schema: str) -> int:
        """Ranges committed on `node` (the harness's per-range log)."""
        return int(str(self.sql(node, f'SELECT count(*) FROM "{schema}".chaos_applied')[0][0]))


@contextlib.contextmanager
def _ha(ctx: Context, name: str) -> Iterator[HA]:
    pair = Pair.create(ctx.work_dir / name / "pg", secrets.token_urlsafe(18), secrets.token_urlsafe(18))
    try:
        pair.start()
        services = Services(pair.url(), pair.url(admin=True), ctx.services.kafka_bootstrap, None)
        sub = Context(services, ctx.rng.getrandbits(32), ctx.work_dir / name, keep=ctx.keep)
        try:
            yield HA(pair, sub)
        finally:
            sub.cleanup()
    finally:
        pair.destroy()


def _history_top(ha: HA, schema: str) -> int:
    """The newest offset-history id on the new primary (the promoted replica)."""
    rows = ha.sql(ha.pair.replica, f'SELECT coalesce(max(id), 0) FROM "{schema}".chaos_offset_history')
    return int(str(rows[0][0]))


def _recovery_s(ha: HA, schema: str, after_id: int, fault_at: float) -> float | None:
    """Seconds from the fault (wall clock) to the first claim committed on the new primary: the
    offset history's first UPDATE after the promotion (its timestamp is the claim's, just before
    its COMMIT)."""
    rows = ha.sql(
        ha.pair.replica,
        f'SELECT extract(epoch FROM min(at)) FROM "{schema}".chaos_offset_history '
        "WHERE id > %s AND op = 'UPDATE'",
        after_id,
    )
    first = rows[0][0] if rows else None
    return None if first is None else float(str(first)) - fault_at


def _failover_run(
    ha: HA,
    result: ScenarioResult,
    *,
    name: str,
    messages: int,
    plan: FaultPlan,
    fault: Callable[[HA, str, str], float],
) -> None:
    """Half the records, the job (following), `fault` (returns its start, wall clock) once the job
    has committed, the other half; then the job must catch up on the new primary, exact."""
    ctx = ha.ctx
    topic, schema, job = ctx.topic(PARTS), ctx.schema(), ctx.name(name.lower())
    first = ctx.produce(topic, messages // 2, PARTS)
    mpp = max(20, messages // PARTS // 16)
    run_dir = ctx.work_dir / "run-00"
    extra = ["--follow", "--force"]
    jp = ctx.job(
        run_dir, job=job, schema=schema, topics=[topic], max_per_partition=mpp, faults=plan, extra=extra
    )
    jp.start()
    result.runs += 1
    if not wait_file(run_dir / "batches", jp, 120):
        result.fail(f"{name}: the job committed no batch before the fault: {jp.wait(5).last_error()!r}")
        return
    time.sleep(ctx.rng.uniform(0.2, 0.8))  # under load
    fault_at = fault(ha, schema, job)
    promoted_top = _history_top(ha, schema)
    result.faults += 1
    second = ctx.produce(topic, messages - messages // 2, PARTS)  # work for the new primary
    result.messages = first.messages + second.messages
    log = ctx.log({topic: PARTS})
    producer_matches(result, log, first, second)
    restarts = 0
    while not ctx.wait_caught_up(jp, schema, job, log.ends, 240):
        res = jp.wait(5)
        restarts += 1
        result.notes.append(f"run {restarts} gave up: {res.last_error()[:160]}")
        if restarts > 3:
            result.fail(f"{name}: the job did not catch up after {restarts} restarts")
            return
        jp = ctx.job(run_dir.parent / f"run-{restarts:02d}", job=job, schema=schema, topics=[topic],
                     max_per_partition=mpp, faults=plan, extra=extra).start()  # fmt: skip
        result.runs += 1
    jp.terminate()
    expect_ok(result, jp.wait(120), f"{name} last run")
    recovery = _recovery_s(ha, schema, promoted_top, fault_at)
    if recovery is None:
        result.fail(f"{name}: nothing was committed on the new primary")
    else:
        result.notes.append(f"recovery (fault -> first commit on the new primary) {recovery:.1f}s")
    if ha.applied(ha.pair.replica, schema) == 0:
        result.fail(f"{name}: the new primary has no committed range")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when=name)
    logs = "".join(p.read_text(errors="replace") for p in ctx.work_dir.glob("run-*/job.log"))
    result.notes.append(
        f"job log: 'read-only' {logs.count('read-only')}x, "
        f"connection lost during COMMIT {logs.count('connection lost during COMMIT')}x, "
        f"offsets found rolled back {logs.count('went back from')}x"
    )


def _walsender_pids(ha: HA) -> list[int]:
    return [int(str(pid)) for (pid,) in ha.sql(ha.pair.primary, "SELECT pid FROM pg_stat_replication")]


@scenario("F15")
def f15_primary_killed(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The primary is killed -9 under load, its replica lagging; the replica is promoted."""
    result = ScenarioResult("F15")

    def kill_and_promote(ha: HA, schema: str, _job: str) -> float:
        # the primary's WAL sender stops for a second: what is committed meanwhile never reaches
        # the replica (asynchronous replication lagging when the primary dies)
        for pid in _walsender_pids(ha):
            os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)
        committed = ha.applied(ha.pair.primary, schema)
        t_fault, fault_at = time.monotonic(), time.time()
        replica.kill_9(ha.pair.primary)  # SIGKILL ends the stopped WAL sender too
        replica.promote(ha.pair.replica, ha.pair.admin_password)
        kept = ha.applied(ha.pair.replica, schema)
        result.notes.append(
            f"promoted in {time.monotonic() - t_fault:.1f}s; at least {committed - kept} of {committed} "
            f"committed ranges lost with the old primary (re-read from Kafka)"
        )
        return fault_at

    # transactions stay open 50 ms after the write: the kill finds some in flight
    plan = FaultPlan(seed=ctx.seed, write_sleep_s=0.05)
    with _ha(ctx, "F15") as ha:
        _failover_run(ha, result, name="F15", messages=messages, plan=plan, fault=kill_and_promote)
    return result


@scenario("F16")
def f16_planned_switchover(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The old primary turns read-only (25006), then stops (57P01); the caught-up replica is
    promoted. A planned switchover loses nothing."""
    result = ScenarioResult("F16")

    def switchover(ha: HA, schema: str, _job: str) -> float:
        old, new = ha.pair.primary, ha.pair.replica
        t_fault, fault_at = time.monotonic(), time.time()
        ha.sql(old, "ALTER SYSTEM SET default_transaction_read_only = on")
        ha.sql(old, "SELECT pg_reload_conf()")
        time.sleep(1.0)  # clients meet the read-only primary
        committed = ha.applied(old, schema)
        replica.wait_replayed(old, new, ha.pair.admin_password)
        replica.stop(old, "fast")
        replica.promote(new, ha.pair.admin_password)
        if (kept := ha.applied(new, schema)) != committed:
            result.fail(
                f"F16: the planned switchover lost ranges: {committed} on the old primary, {kept} kept"
            )
        result.notes.append(
            f"switched over in {time.monotonic() - t_fault:.1f}s ({committed} ranges, none lost)"
        )
        return fault_at

    with _ha(ctx, "F16") as ha:
        _failover_run(
            ha, result, name="F16", messages=messages, plan=FaultPlan(seed=ctx.seed), fault=switchover
        )
    return result


@scenario("F17")
def f17_commit_in_flight(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The primary dies while one of the job's COMMITs is in flight; the guard's re-read goes to
    the new primary."""
    result = ScenarioResult("F17")

    def freeze_promote_kill(ha: HA, _schema: str, job: str) -> float:
        old = ha.pair.primary
        query = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'active' "
            "AND query = 'COMMIT'"
        )
        deadline = time.monotonic() + 60
        while not ha.sql(old, query, app_name(job)):
            if time.monotonic() > deadline:
                result.fail("F17: no COMMIT of the job caught in flight within 60s")
                break
            time.sleep(0.01)
        t_fault, fault_at = time.monotonic(), time.time()
        replica.freeze(old, [])  # the old primary stops dead inside the COMMIT: no answer, no commit
        replica.promote(ha.pair.replica, ha.pair.admin_password)
        replica.kill_9(old)  # SIGKILL ends the stopped processes: nothing of them runs again
        result.notes.append(f"COMMIT caught in flight; promoted in {time.monotonic() - t_fault:.1f}s")
        return fault_at

    plan = FaultPlan(seed=ctx.seed, commit_probe=True)
    with _ha(ctx, "F17") as ha:
        _failover_run(ha, result, name="F17", messages=messages, plan=plan, fault=freeze_promote_kill)
    return result
