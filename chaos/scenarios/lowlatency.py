"""Low-latency mode under process faults (F18): kill -9 of the driver while its long-running tasks
commit small ranges, then kill -9 of one long-running task's Python worker in the next run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path

from chaos.faults import FaultPlan
from chaos.procs import JobProcess
from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, expect_ok, producer_matches, scenario
from txn_offsets.config import KafkaSettings
from txn_offsets.kafka.metadata import watermarks

logger = logging.getLogger(__name__)

F18_EPOCH_S = 20.0  # long enough that both kills land inside an epoch
F18_BOUND_S = 240.0  # each wait of the scenario, Spark's start included


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(raw[raw.rfind(")") + 2 :].split()[1])


def python_workers(jp: JobProcess) -> list[int]:
    """The job's PySpark Python workers: the children of its pyspark.daemon (each runs one task
    at a time; in low-latency mode every one of them holds a long-running task)."""
    jp.sample()
    daemons = {pid for pid in jp.seen if "pyspark.daemon" in _cmdline(pid)}
    return sorted(pid for pid in daemons if _ppid(pid) in daemons)


def settled(ctx: Context, topic: str, parts: int, timeout_s: float = 60.0) -> None:
    """Until no transaction is open on `topic` (its read_committed end = its high watermark):
    ``commit_transaction()`` returns before the markers are written, so the LSO can lag a moment
    (chaos.invariants' own wait compares two read_committed ends, librdkafka's default)."""
    kafka = KafkaSettings(ctx.services.kafka_bootstrap)
    tps = [(topic, p) for p in range(parts)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lso = watermarks(kafka, tps)
        hwm = watermarks(dataclasses.replace(kafka, isolation_level="read_uncommitted"), tps)
        if all(lso[tp][1] == hwm[tp][1] for tp in tps):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{topic}: a transaction is still open after {timeout_s:.0f}s")


def _progress(ctx: Context, schema: str, job: str, jp: JobProcess, *, above: int, timeout_s: float) -> bool:
    """Until the job's stored offsets sum past `above` (commits are landing), the job exits, or the
    deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and jp.running():
        with contextlib.suppress(Exception):
            if sum(ctx.stored(schema, job).values()) > above:
                return True
        time.sleep(0.05)
    return False


@scenario("F18")
def f18_low_latency_kills(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    """Low-latency mode (epochs of long-running tasks committing ranges of at most 20 records, each
    transaction slowed by 20 ms per range so that the kills land while commits are flowing):
    run 1 is killed -9 (the driver) once commits land; run 2 (--force) gets one of its Python
    workers killed -9 while it follows the topic - Spark retries that task, which continues from
    the table - and is stopped (SIGTERM) once it caught up. I1-I3 after each."""
    result = ScenarioResult("F18")
    parts = 4
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f18")
    first = ctx.produce(topic, messages // 2, parts)
    settled(ctx, topic, parts)
    slow = FaultPlan(seed=ctx.seed, write_sleep_s=0.02)
    common = {"job": job, "schema": schema, "topics": [topic], "max_per_partition": 20, "faults": slow}
    low = ["--low-latency", str(F18_EPOCH_S), "--follow", "--force"]

    # run 1: the driver killed -9 while its tasks commit
    run1 = ctx.job(ctx.work_dir / "F18" / "driver-kill", **common, extra=low).start()
    result.runs += 1
    if _progress(ctx, schema, job, run1, above=0, timeout_s=F18_BOUND_S):
        time.sleep(ctx.rng.uniform(0.05, 0.3))
        run1.kill9()
    res1 = run1.wait(F18_BOUND_S)
    if res1.killed:
        result.faults += 1
    else:
        result.fail(f"F18 run 1: the driver was not killed: exit {res1.returncode} {res1.last_error()!r}")
    before = sum(ctx.stored(schema, job).values())
    second = ctx.produce(topic, messages - messages // 2, parts)
    settled(ctx, topic, parts)
    log = ctx.log({topic: parts})
    producer_matches(result, log, first, second)
    result.messages = first.messages + second.messages
    ctx.check(result, schema=schema, job=job, log=log, final=False, when="after the driver kill")
    if before >= sum(log.ends.values()):
        result.notes.append("run 1 had committed everything before its kill")

    # run 2: one long-running task's Python worker killed -9
    run2 = ctx.job(ctx.work_dir / "F18" / "worker-kill", **common, extra=low).start()
    result.runs += 1
    killed = 0
    if _progress(ctx, schema, job, run2, above=before, timeout_s=F18_BOUND_S):
        workers = python_workers(run2)
        if workers:
            victim = ctx.rng.choice(workers)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
                killed = 1
    caught_up = ctx.wait_caught_up(run2, schema, job, log.ends, F18_BOUND_S)
    run2.terminate()
    res2 = run2.wait(120)
    expect_ok(result, res2, "F18 run 2")
    retried = "exited unexpectedly" in res2.log or "Lost task" in res2.log
    if killed and retried:
        result.faults += 1
    else:
        result.fail(f"F18: no long-running task's worker was killed and retried (killed={killed})")
    if not caught_up:
        result.fail("F18: run 2 never caught up")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F18 final")
    result.notes.append(
        f"driver killed with {before} of {sum(log.ends.values())} offsets committed; a worker killed in run 2"
    )
    return result
