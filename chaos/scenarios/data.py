"""Data faults: records lost to retention (F7), partitions added (F8), poison records (F9),
compacted topics with aborted transactions (F10), a topic deleted and re-created (F12).
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
from chaos.invariants import KafkaLog, read_log
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    JOB_TIMEOUT_S,
    Context,
    changed,
    expect_ok,
    producer_matches,
    scenario,
    snapshot,
    wait_file,
)

logger = logging.getLogger(__name__)


# --- F7, F12 -------------------------------------------------------------------------------
TP = tuple[str, int]


def _data_loss_runs(
    ctx: Context,
    result: ScenarioResult,
    *,
    name: str,
    job: str,
    schema: str,
    topic: str,
    names: str,
    skips: dict[TP, tuple[int, int]],
) -> None:
    """The two runs after records the job had not processed are gone (F7, F12): the default policy
    must fail with DataLoss naming `names` and change nothing (offset and audit rows, results,
    offset history); ``--on-data-loss skip`` must succeed and audit exactly `skips` ({(topic,
    partition): (old, new)}) as new ``data_loss_skip`` rows. The caller checks I1-I3 with its own
    oracle afterwards."""
    before = snapshot(ctx, schema, job)
    skipped_before = _skips(ctx, schema, job)
    res = (
        ctx.job(ctx.work_dir / name / "fail", job=job, schema=schema, topics=[topic], max_per_partition=10**6)
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    if res.returncode != 1 or "chaos-job: DataLoss:" not in res.last_error() or names not in res.last_error():
        result.fail(
            f"{name}: default policy did not fail with DataLoss naming {names}: "
            f"exit {res.returncode} {res.last_error()!r}"
        )
    if diff := changed(before, snapshot(ctx, schema, job)):
        result.fail(f"{name}: the failed run changed {', '.join(diff)}")
    res = (
        ctx.job(
            ctx.work_dir / name / "skip",
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
    got = sorted(_skips(ctx, schema, job)[len(skipped_before) :])
    want = [(t, p, old, new) for (t, p), (old, new) in sorted(skips.items())]
    if got != want:
        result.fail(f"{name}: the skip run audited data_loss_skip rows {got}, expected {want}")


def _skips(ctx: Context, schema: str, job: str) -> list[tuple[str, int, int, int]]:
    """The job's audited data_loss_skip moves (topic, partition, old, new), oldest first."""
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f'SELECT topic, part, old_off, new_off FROM "{schema}".offset_audit '
                "WHERE job = :j AND action = 'data_loss_skip' ORDER BY id"
            ),
            {"j": job},
        ).all()
    return [(r.topic, r.part, r.old_off, r.new_off) for r in rows]


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
    result.runs += 1
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
    _data_loss_runs(
        ctx,
        result,
        name="F7",
        job=job,
        schema=schema,
        topic=topic,
        names=f"{topic}[0]",
        skips={tp: (stored[tp], cut)},
    )
    ctx.check(
        result, schema=schema, job=job, log=log, final=True, when="F7", excluded={tp: [(stored[tp], cut)]}
    )
    lost = log.count_between(tp, stored[tp], cut)
    result.notes.append(f"{lost} records deleted before processing, skipped with an audit row")
    return result


@scenario("F12")
def f12_topic_recreated(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """After the job caught up, its topic is deleted and re-created under the same name and
    partition count, twice: first with fewer records than before (the new ends lie below the
    stored offsets), then with more (the new ends lie beyond them: only the Kafka topic id tells
    the topics apart). Each time the default policy fails with DataLoss and changes nothing, and
    on_data_loss=skip moves every partition to the new topic's log start (audited) and counts each
    record of the new topic once, on top of the earlier topics' records counted once."""
    result = ScenarioResult("F12")
    parts = 2
    topic, schema, job = ctx.topic(parts), ctx.schema(), ctx.name("f12")
    oracle = ctx.produce(topic, max(1, messages * 3 // 8), parts)
    result.messages = oracle.messages
    log = ctx.log({topic: parts})
    producer_matches(result, log, oracle)
    res = (
        ctx.job(
            ctx.work_dir / "F12" / "first", job=job, schema=schema, topics=[topic], max_per_partition=10**6
        )
        .start()
        .wait(JOB_TIMEOUT_S)
    )
    result.runs += 1
    expect_ok(result, res, "F12 first run")
    ctx.check(result, schema=schema, job=job, log=log, final=True, when="F12 first run")
    earlier: list[KafkaLog] = []
    # fewer records than the topic had (an eighth of the budget), then more (half of it)
    for variant, count in (("fewer", messages // 8), ("more", messages // 2)):
        name = f"F12-{variant}"
        stored = ctx.stored(schema, job)
        old_id = ctx.topic_id(topic)
        ctx.recreate_topic(topic, parts)
        result.faults += 1
        earlier.append(log)
        oracle = ctx.produce(topic, max(1, count), parts)
        result.messages += oracle.messages
        log = ctx.log({topic: parts})
        producer_matches(result, log, oracle)
        if ctx.topic_id(topic) == old_id:
            result.fail(f"{name}: the re-created topic kept its topic id {old_id}")
        below = [tp for tp in log.ends if log.ends[tp] < stored[tp]]
        if (variant == "fewer") != bool(below):
            result.fail(f"{name}: setup: the new ends {log.ends} vs the stored offsets {stored}")
        _data_loss_runs(
            ctx,
            result,
            name=name,
            job=job,
            schema=schema,
            topic=topic,
            names=topic,
            skips={tp: (stored[tp], log.starts[tp]) for tp in log.ends},
        )
        ctx.check(result, schema=schema, job=job, log=log, final=True, when=name, earlier=earlier)
        result.notes.append(
            f"{variant}: {log.records} records, {len(below)} of {parts} ends below the stored offsets"
        )
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
