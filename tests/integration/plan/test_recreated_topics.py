"""The offsets stored for a topic deleted and created again (a new Kafka topic id) are never read in
the new topic as if they were its own.

A reset stores the topic id of the incarnation its offsets were chosen in, so a topic re-created after
it is data loss on the next plan. A skip (``on_data_loss="skip"``) resumes at the NEW log's start,
even when the log offsets Kafka gave the plan were the old topic's.

A plan asks Kafka for the topics' ids and their partitions' (log start, end) at once. When the topic
is deleted and created again between the two answers, the id can be the new topic's and the offsets
the old one's. Before: the skip of a re-created topic resumed at that old log start, passing over the
new topic's first records (audited as a data-loss skip of the wrong size). Now the offsets of a
re-created topic are asked again after its new id was seen and confirmed by a Fetch that names the
topic by that id (plan.moves._confirmed, kafka/recreated.py). The old log's answer is injected by
replacing the first watermarks call: the interleaving itself is a race no test can schedule on one
broker (the lab's lagging leader gives it for real: tests/lab/test_lab_recreated_topic.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.helpers import offsets_of, produce_counts
from tests.kafka_topics import old_log_first, recreate_topic
from txn_offsets.admin.reset import ResetTarget, apply_reset, plan_reset
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import DataLoss, ServiceUnavailable
from txn_offsets.kafka import metadata, reader, recreated
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, Plan, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import offset_rows
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


def test_a_recreated_topic_resumes_at_the_new_logs_start_whatever_offsets_came_with_its_id(
    migrated: DatabaseSettings,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    engine = engine_for(migrated)
    try:
        run = _read_to_its_end(engine, migrated, kafka, topic, "recreated-marks")
        old_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
        recreate_topic(kafka_admin, topic, 1)
        produce_counts(kafka_bootstrap, topic, {0: 150})
        new_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
        assert new_id != old_id

        # the answer the old topic's log gave (its start, had retention run)
        calls = old_log_first(monkeypatch, (50, 100))
        plan = _plan(engine, migrated, kafka, run, topic=topic, on_data_loss="skip")
        assert len(calls) >= 2  # the offsets asked again once the new id was seen
        assert plan.ranges == (OffsetRange(topic, 0, 0, 150, new_id),)  # every record of the new topic
        assert offsets_of(engine, migrated, run.job) == {(topic, 0): 0}
        assert _skips(engine, migrated, run.job) == [(100, 0)]
    finally:
        engine.dispose()


def test_a_first_plan_seeds_at_the_log_that_holds_the_topic_id_whatever_offsets_came_with_it(
    migrated: DatabaseSettings,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's first plan seeds its rows at the log start Kafka gives. On the lab a leader lagging
    behind the metadata log gave a deleted topic's (20, 30) beside the new id: seeded at 20, the
    new topic's first 20 records were never read. Before: the seed took that answer as it came."""
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    produce_counts(kafka_bootstrap, topic, {0: 10})
    topic_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    engine = engine_for(migrated)
    try:
        run = start_run(Store(engine, migrated), "seeded-marks")
        calls = old_log_first(
            monkeypatch, (20, 30)
        )  # the deleted topic's log, as the lagging leader answered
        plan = _plan(engine, migrated, kafka, run, topic=topic)
        assert offsets_of(engine, migrated, run.job) == {(topic, 0): 0}  # before: seeded at 20
        assert plan.ranges == (OffsetRange(topic, 0, 0, 10, topic_id),)  # every record of the topic
        assert len(calls) >= 2  # the seed's marks asked again and confirmed by topic id
    finally:
        engine.dispose()


@pytest.mark.parametrize("first", ["row_on_the_new_id", "seed_at_a_timestamp"])
def test_a_plan_is_not_handed_out_while_a_broker_names_the_topics_old_id(
    first: str,
    migrated: DatabaseSettings,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the lab a broker cut off from the controllers still names a re-created topic's old id and
    serves the old log's records at the planned offsets (tests/lab/test_lab_recreated_topic.py);
    the commit's proof asks every broker AFTER the read, so if that broker catches up in between,
    the old records pass as the new topic's. Now a plan's ranges are handed out only once no
    broker names another id. That broker's answer is injected beside the stack's one real broker.
    Before: the plan was handed out at once. And a seed at a timestamp takes Kafka's ListOffsets by
    time, which names no topic id (that broker answers it from the deleted log): the barrier runs
    before any move, so nothing is seeded meanwhile (before: seeded and committed, then refused)."""
    kafka = KafkaSettings(kafka_bootstrap)
    topic, old_id, new_id = _recreated_with_30(kafka, kafka_admin, topic_factory)
    engine = engine_for(migrated)
    try:
        run = start_run(Store(engine, migrated), f"lagging-broker-{first}")
        start, stored = StartPolicy.at_timestamp(0), {}
        if first == "row_on_the_new_id":  # nothing to move: a row on the new id at 0
            start, stored = StartPolicy.earliest(), {(topic, 0): 0}
            with engine.begin() as conn:
                offset_rows.seed_offsets(
                    conn, migrated, run.job, stored, reason="t", actor="t", topic_ids={topic: new_id}
                )
        behind = _lagging_broker(monkeypatch, topic, old_id)
        with pytest.raises(
            ServiceUnavailable, match=re.escape(f"10.47.45.99:9092 still names topic id {old_id}")
        ):
            _plan(engine, migrated, kafka, run, topic=topic, timeout_s=3.0, start=start)
        assert offsets_of(engine, migrated, run.job) == stored  # nothing moved, nothing seeded
        behind[0] = False  # caught up: it applied the deletion and the new topic
        plan = _plan(engine, migrated, kafka, run, topic=topic, start=start)
        assert plan.ranges == (OffsetRange(topic, 0, 0, 30, new_id),)
        assert offsets_of(engine, migrated, run.job) == {(topic, 0): 0}
    finally:
        engine.dispose()


def test_a_read_waits_while_a_broker_its_process_reaches_names_the_topics_old_id(
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner's barrier is asked from the driver; a task's process may reach a broker the driver
    cannot. So a read asks it again (once per process and topic id): nothing is read while a broker
    names the old id. Before: the read went ahead."""
    kafka = KafkaSettings(kafka_bootstrap)
    topic, old_id, new_id = _recreated_with_30(kafka, kafka_admin, topic_factory)
    behind = _lagging_broker(monkeypatch, topic, old_id)
    monkeypatch.setattr(reader, "SETTLE_TIMEOUT_S", 1.0)
    rng = OffsetRange(topic, 0, 0, 30, new_id)
    with pytest.raises(ServiceUnavailable, match=re.escape(f"still names topic id {old_id}")):
        reader.read_ranges(kafka, [rng])
    with pytest.raises(ServiceUnavailable, match=re.escape(f"still names topic id {old_id}")):
        list(reader.read_range(kafka, rng))
    behind[0] = False
    assert [r.offset for r in reader.read_ranges(kafka, [rng])[(topic, 0)]] == list(range(30))


def _recreated_with_30(
    kafka: KafkaSettings, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> tuple[str, str, str]:
    """A topic of 10 records deleted and created again with 30: (name, old id, new id)."""
    topic = topic_factory(partitions=1)
    produce_counts(kafka.bootstrap_servers, topic, {0: 10})
    old_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    recreate_topic(kafka_admin, topic, 1)
    produce_counts(kafka.bootstrap_servers, topic, {0: 30})
    return topic, old_id, metadata.describe_topics(kafka, [topic])[topic].topic_id


def _lagging_broker(monkeypatch: pytest.MonkeyPatch, topic: str, old_id: str) -> list[bool]:
    """Every broker's views as they are, and one more broker naming `old_id` for `topic` (a broker
    cut off from the controllers) while the returned flag holds."""
    real = recreated.Brokers.views
    behind = [True]

    def views(self: recreated.Brokers, topics: Any, timeout_s: float) -> dict[str, Any]:
        got = real(self, topics, timeout_s)
        if behind[0]:
            got["10.47.45.99:9092"] = {
                t: recreated.View(old_id if t == topic else None, {}, frozenset()) for t in topics
            }
        return got

    monkeypatch.setattr(recreated.Brokers, "views", views)
    return behind


def _plan(engine: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings, run: Run, **kw: Any) -> Plan:
    return plan_batch(
        Store(engine, db),
        kafka,
        job=run.job,
        selection=TopicSelection((kw.pop("topic"),)),
        start=kw.pop("start", StartPolicy.earliest()),
        limits=Limits(),
        run=run,
        **kw,
    )


# Before: a reset stored its offsets without a topic id ("for the topic as it is now"); the next plan
# adopted the NEW topic's id for them and read the new topic from offset 60 on: its first 60 records
# were never counted, with no DataLoss and no audit row. Now the reset records the incarnation its
# offsets were chosen in (described before and after the targets).
def test_a_reset_then_a_recreated_topic_is_data_loss_not_a_silent_skip(
    migrated: DatabaseSettings, kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    engine = engine_for(migrated)
    try:
        run = _read_to_its_end(engine, migrated, kafka, topic, "reset-then-recreated")
        plan = plan_reset(
            Store(engine, migrated), run.job, ResetTarget("offset", 60), topic=topic, kafka=kafka
        )
        apply_reset(Store(engine, migrated), plan, reason="replay the last 40", force=True)

        recreate_topic(kafka_admin, topic, 1)
        produce_counts(kafka_bootstrap, topic, {0: 150})
        new_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
        run = start_run(Store(engine, migrated), run.job)
        with pytest.raises(DataLoss) as info:
            _plan(engine, migrated, kafka, run, topic=topic)
        assert (info.value.kind, info.value.stored, info.value.log_start) == ("recreated", 60, 0)
        assert offsets_of(engine, migrated, run.job) == {(topic, 0): 60}  # nothing moved

        skipped = _plan(engine, migrated, kafka, run, topic=topic, on_data_loss="skip")
        assert skipped.ranges == (OffsetRange(topic, 0, 0, 150, new_id),)  # every record of the new topic
        assert _skips(engine, migrated, run.job) == [(60, 0)]

        # the other order: re-created, then reset - the reset's offsets are the new topic's
        recreate_topic(kafka_admin, topic, 1)
        produce_counts(kafka_bootstrap, topic, {0: 30})
        newest = metadata.describe_topics(kafka, [topic])[topic].topic_id
        plan = plan_reset(Store(engine, migrated), run.job, ResetTarget("earliest"), topic=topic, kafka=kafka)
        apply_reset(Store(engine, migrated), plan, reason="the topic was re-created", force=True)
        run = start_run(Store(engine, migrated), run.job)
        assert _plan(engine, migrated, kafka, run, topic=topic).ranges == (
            OffsetRange(topic, 0, 0, 30, newest),
        )
        assert _skips(engine, migrated, run.job) == [(60, 0)]  # no data loss this time
    finally:
        engine.dispose()


def _skips(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f'SELECT old_off, new_off FROM "{db.schema}".offset_audit '
                "WHERE job = :j AND action = 'data_loss_skip' ORDER BY id"
            ),
            {"j": job},
        ).all()
    return [(r.old_off, r.new_off) for r in rows]


def _read_to_its_end(
    engine: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings, topic: str, job: str
) -> Run:
    """A run of `job` whose offset row says it read the 100 records of `topic` (one partition) to
    their end, with the topic's id of now."""
    produce_counts(kafka.bootstrap_servers, topic, {0: 100})
    topic_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    run = start_run(Store(engine, db), job)
    with engine.begin() as conn:
        offset_rows.seed_offsets(
            conn, db, run.job, {(topic, 0): 100}, reason="t", actor="t", topic_ids={topic: topic_id}
        )
    return run
