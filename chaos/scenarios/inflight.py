"""A topic deleted and re-created while a batch is in flight (F12b): between the batch's plan and
its read, so the readers are handed the NEW topic's records at offsets planned from the OLD one.

Every task of the batch is held before its first read (``FaultPlan.hold_after_batches``), so the
stored offsets are still and the window is certain, not a matter of timing. The harness then
re-creates the topic with as many records as before (the planned ranges lie inside the new log,
so the reads complete) and lets the tasks go. Nothing of the held batch may be committed: the
old topic counts as far as the job had applied it when it was deleted, the new one from its
start, each record once. With the default policy the run must end with DataLoss (``recreated``)
and change nothing after the re-creation, and a run with ``on_data_loss=skip`` then reads the new
topic; with ``skip`` from the start, the held run itself goes on.
"""

from __future__ import annotations

import bisect
import logging
import time
from array import array
from pathlib import Path

from chaos.faults import FaultPlan
from chaos.invariants import KafkaLog
from chaos.report import ScenarioResult
from chaos.scenarios.context import JOB_TIMEOUT_S, Context, expect_ok, producer_matches, scenario
from chaos.scenarios.data import _skips

logger = logging.getLogger(__name__)

TP = tuple[str, int]


def applied_part(log: KafkaLog, stored: dict[TP, int]) -> KafkaLog:
    """`log` as far as the job applied it: the records below the stored offsets, which become the
    ends (the rest of the old topic was deleted before anything read it)."""
    part = KafkaLog(names=log.names, starts=dict(log.starts))
    for tp, offsets in log.offsets.items():
        cut = bisect.bisect_left(offsets, stored.get(tp, 0))
        part.offsets[tp] = array(offsets.typecode, offsets[:cut])
        part.keys[tp] = array(log.keys[tp].typecode, log.keys[tp][:cut])
        part.ends[tp] = stored.get(tp, 0)
    return part


def _wait_held(run_dir: Path, jp: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and jp.running():  # type: ignore[attr-defined]
        if any(run_dir.glob("held-*")):
            return True
        time.sleep(0.1)
    return any(run_dir.glob("held-*"))


@scenario("F12b")
def f12b_topic_recreated_in_flight(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """The topic is re-created while the job's second batch is held before its read, once under
    the default policy (DataLoss, then a skip run) and once under on_data_loss=skip."""
    result = ScenarioResult("F12b")
    parts = 2
    per_variant = max(1, messages // 4)
    for policy in ("fail", "skip"):
        name = f"F12b-{policy}"
        topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name(f"f12b{policy}")
        oracle = ctx.produce(topic, per_variant, parts)
        result.messages += oracle.messages
        old_log = ctx.log({topic: parts})
        producer_matches(result, old_log, oracle)
        run_dir = ctx.work_dir / "F12b" / policy
        run_dir.mkdir(parents=True, exist_ok=True)
        # about four batches, so the held second batch lies well inside the old (and new) log
        mpp = max(10, min(old_log.ends.values()) // 4)
        plan = FaultPlan(seed=ctx.seed, hold_after_batches=1, run_dir=str(run_dir))
        jp = ctx.job(
            run_dir,
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=mpp,
            faults=plan,
            extra=["--on-data-loss", policy],
        ).start()
        result.runs += 1
        if not _wait_held(run_dir, jp, JOB_TIMEOUT_S):
            res = jp.wait(5)
            result.fail(
                f"{name}: no task was held before its read: exit {res.returncode} {res.last_error()!r}"
            )
            continue
        time.sleep(1.0)  # the batch's other task reaches its hold too (or is queued behind it)
        stored = ctx.stored(schema, job)
        earlier = applied_part(old_log, stored)
        old_id = ctx.topic_id(topic)
        ctx.recreate_topic(topic, parts)
        result.faults += 1
        oracle = ctx.produce(topic, per_variant, parts)
        result.messages += oracle.messages
        log = ctx.log({topic: parts})
        producer_matches(result, log, oracle)
        if ctx.topic_id(topic) == old_id:
            result.fail(f"{name}: the re-created topic kept its topic id {old_id}")
        (run_dir / "resume").write_text("")
        res = jp.wait(JOB_TIMEOUT_S)
        if policy == "fail":
            if res.returncode != 1 or "chaos-job: DataLoss:" not in res.last_error():
                result.fail(
                    f"{name}: the held run did not end with DataLoss: "
                    f"exit {res.returncode} {res.last_error()!r}"
                )
            elif "recreated" not in res.last_error() and "re-created" not in res.last_error():
                result.fail(f"{name}: DataLoss does not say the topic was re-created: {res.last_error()!r}")
            if (now := ctx.stored(schema, job)) != stored:
                result.fail(f"{name}: offsets moved after the topic was re-created: {stored} -> {now}")
            res = (
                ctx.job(
                    run_dir / "skip",
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
        expect_ok(result, res, f"{name} skip run")
        got = sorted(_skips(ctx, schema, job))
        want = sorted((t, p, stored[(t, p)], log.starts[(t, p)]) for t, p in log.ends)
        if got != want:
            result.fail(f"{name}: audited data_loss_skip rows {got}, expected {want}")
        ctx.check(result, schema=schema, job=job, log=log, final=True, when=name, earlier=[earlier])
        result.notes.append(
            f"{policy}: re-created at {dict(sorted(stored.items()))} (old topic applied {earlier.records} of "
            f"{old_log.records}); new topic {log.records} records"
        )
    return result
