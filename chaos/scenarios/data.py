"""Data faults: records lost to retention (F7), partitions added (F8), poison records (F9),
compacted topics with aborted transactions (F10).
"""

from __future__ import annotations

import json
import logging
import time

import sqlalchemy as sa
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KTopicPartition
from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

from chaos.faults import FaultPlan
from chaos.invariants import read_log
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    JOB_TIMEOUT_S,
    Context,
    expect_ok,
    producer_matches,
    scenario,
    snapshot,
    wait_file,
)

logger = logging.getLogger(__name__)


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
    expect_ok(result, run.start().wait(JOB_TIMEOUT_S), "F7 first run")
    second = ctx.produce(topic, messages - messages // 2, parts)
    result.messages = first.messages + second.messages
    log = ctx.log({topic: parts})  # before the deletion: the oracle of what was produced
    producer_matches(result, log, first, second)
    stored = ctx.stored(schema, job)
    tp = (topic, 0)
    cut = stored[tp] + max(1, (log.ends[tp] - stored[tp]) // 3)
    for fut in ctx.admin.delete_records([KTopicPartition(topic, 0, cut)]).values():
        fut.result(30)
    result.faults += 1
    before = snapshot(ctx, schema, job)
    res = (
        ctx.job(ctx.work_dir / "F7" / "fail", job=job, schema=schema, topics=[topic], max_per_partition=10**6)
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 2
    if res.returncode != 1 or "DataLoss" not in res.last_error() or f"{topic}[0]" not in res.last_error():
        result.fail(f"F7: default policy did not fail with DataLoss: {res.returncode} {res.last_error()!r}")
    if snapshot(ctx, schema, job) != before:
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
    expect_ok(result, res, "F7 skip run")
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
    wait_file(run_dir / "batches", jp, 120)
    ctx.admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    result.faults += 1
    second = ctx.produce(topic, messages - messages // 2, 4)
    result.messages = first.messages + second.messages
    log = ctx.log({topic: 4})
    producer_matches(result, log, first, second)
    caught_up = ctx.wait_caught_up(jp, schema, job, log.ends, 300)
    jp.terminate()
    expect_ok(result, jp.wait(120), "F8 run")
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
    expect_ok(result, res, "F10 run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F10")
    return result
