"""The next plan's rows read while a batch runs (spark.ahead.PlanAhead): once every range of the
batch committed, it is the plan plan_batch makes after the batch, against fresh watermarks; where
a range did not commit, a row moved meanwhile or the run was fenced, there is none (the run plans
as always, and plan_batch meets what is due). Real PostgreSQL and Kafka; the batch's commit is
commit_ranges itself (what a task runs), without Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits, Plan, TopicSelection, plan_batch
from txn_offsets.spark.ahead import PlanAhead
from txn_offsets.store.database import engine_for
from txn_offsets.store.runs import Run, start_run
from txn_offsets.store.schema import tables_for
from txn_offsets.store.transaction import commit_ranges

from .helpers import produce_counts

LIMITS = Limits(max_records_per_partition=3)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


@pytest.fixture
def store(migrated: DatabaseSettings) -> Iterator[sa.Engine]:
    eng = engine_for(migrated)
    yield eng
    eng.dispose()


def _plan(store: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings, run: Run, topic: str) -> Plan:
    return plan_batch(
        store, db, kafka, job=run.job, selection=TopicSelection((topic,)), start=StartPolicy.earliest(),
        limits=LIMITS, run=run,
    )  # fmt: skip


def _first_batch(
    store: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings, job: str, topic: str
) -> tuple[Run, Plan, PlanAhead]:
    run = start_run(store, db, job)
    plan = _plan(store, db, kafka, run, topic)  # the first plan seeds
    assert plan.ranges
    return run, plan, PlanAhead(store, db, run)


def test_the_plan_ahead_is_the_plan_after_the_batch_with_fresh_watermarks(
    store: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=3)
    produce_counts(kafka.bootstrap_servers, topic, {0: 5, 1: 2, 2: 0})
    run, first, ahead = _first_batch(store, migrated, kafka, job_name, topic)
    try:
        ahead.start(first.ranges)  # the batch's Spark job starts: the rows are read meanwhile
        assert [o.outcome.value for o in commit_ranges(store, migrated, run, first.ranges)] == [
            "committed"
        ] * 2
        produce_counts(kafka.bootstrap_servers, topic, {2: 4})  # arrived while the batch ran
        ahead.confirm()
        planned = ahead.take(kafka, TopicSelection((topic,)), LIMITS)
        assert planned is not None
        assert planned == _plan(store, migrated, kafka, run, topic)  # what plan_batch makes now
        assert dict(planned.stored) == {(topic, 0): 3, (topic, 1): 2, (topic, 2): 0}
        assert [(r.partition, r.start, r.until) for r in planned.ranges] == [(0, 3, 5), (2, 0, 3)]
        assert ahead.take(kafka, TopicSelection((topic,)), LIMITS) is None  # taken once
    finally:
        ahead.close()


def test_no_plan_ahead_unless_every_range_committed(
    store: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=2)
    produce_counts(kafka.bootstrap_servers, topic, {0: 5, 1: 5})
    run, first, ahead = _first_batch(store, migrated, kafka, job_name, topic)
    try:
        ahead.start(first.ranges)
        commit_ranges(store, migrated, run, first.ranges[:1])  # one range committed, one not
        # unconfirmed (the runner confirms only a batch whose every range committed): no plan, and
        # the plan made as always starts the uncommitted range where it stands
        assert ahead.take(kafka, TopicSelection((topic,)), LIMITS) is None
        again = _plan(store, migrated, kafka, run, topic)
        assert [(r.partition, r.start) for r in again.ranges] == [(0, 3), (1, 0)]
    finally:
        ahead.close()


def test_a_row_moved_meanwhile_leaves_the_plan_to_plan_batch(
    store: sa.Engine,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=2)
    produce_counts(kafka.bootstrap_servers, topic, {0: 5, 1: 5})
    run, first, ahead = _first_batch(store, migrated, kafka, job_name, topic)
    offsets = tables_for(migrated.schema).offsets
    with engine.begin() as conn:  # a row of the batch at neither end of its range
        conn.execute(sa.update(offsets).where(offsets.c.job == run.job, offsets.c.part == 1).values(off=1))
    try:
        ahead.start(first.ranges)
        ahead.confirm()
        assert ahead.take(kafka, TopicSelection((topic,)), LIMITS) is None
    finally:
        ahead.close()


def test_a_fenced_run_gets_no_plan_ahead_and_plan_batch_says_fenced(
    store: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=1)
    produce_counts(kafka.bootstrap_servers, topic, {0: 5})
    run, first, ahead = _first_batch(store, migrated, kafka, job_name, topic)
    start_run(store, migrated, job_name, force=True)  # a newer run takes the job
    try:
        ahead.start(first.ranges)
        ahead.confirm()
        assert ahead.take(kafka, TopicSelection((topic,)), LIMITS) is None
        with pytest.raises(Fenced):
            _plan(store, migrated, kafka, run, topic)
    finally:
        ahead.close()
