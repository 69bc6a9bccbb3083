"""A running job's plan that moves nothing is ONE statement (plan.planner._renewed_rows,
lease.renew_and_load: the lease renewed and the rows read together, autocommit) instead of a
transaction of four round trips, sent while Kafka answers the plan's own requests; whatever has to
be moved or raised (a first plan, a partition to seed, a lineage prune due, a fenced run) still
goes through the plan's transaction."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.fix_services import TopicFactory
from tests.integration.helpers import offsets_of, produce_counts
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced, TxnOffsetsError
from txn_offsets.kafka import metadata
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan import planner
from txn_offsets.plan.planner import Limits, Plan, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store import lineage
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.lease import renew_and_load
from txn_offsets.store.offset_rows import load_rows
from txn_offsets.store.runs import Run, lock_job, start_run
from txn_offsets.store.schema import tables_for


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


class _Statements:
    """The statements an engine sends (their first words), while counting."""

    def __init__(self, engine: sa.Engine) -> None:
        self.seen: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._one)

    def _one(self, conn: object, cursor: object, statement: str, *args: object) -> None:
        self.seen.append(" ".join(statement.split())[:60])


@pytest.fixture
def counted(migrated: DatabaseSettings) -> Iterator[tuple[sa.Engine, _Statements]]:
    eng = engine_for(migrated)
    yield eng, _Statements(eng)
    eng.dispose()


@dataclass(frozen=True)
class Planning:
    """The test's job over fresh topics: its migrated schema, Kafka, topic factory and job name."""

    db: DatabaseSettings
    kafka: KafkaSettings
    topic_factory: TopicFactory
    job: str

    def started(
        self, engine: sa.Engine, counts: dict[int, int], db: DatabaseSettings | None = None
    ) -> tuple[str, Run]:
        """A topic of len(counts) partitions holding counts[p] records each, and a run started."""
        topic = self.topic_factory(partitions=len(counts))
        produce_counts(self.kafka.bootstrap_servers, topic, counts)
        return topic, start_run(Store(engine, db or self.db), self.job)

    def plan(self, engine: sa.Engine, run: Run, topic: str, db: DatabaseSettings | None = None) -> Plan:
        """The run's next plan over `topic`, from the earliest offsets, at most 3 records a range."""
        return plan_batch(
            Store(engine, db or self.db),
            self.kafka,
            job=run.job,
            selection=TopicSelection((topic,)),
            start=StartPolicy.earliest(),
            limits=Limits(max_records_per_partition=3),
            run=run,
        )


@pytest.fixture
def planning(
    migrated: DatabaseSettings, kafka: KafkaSettings, topic_factory: TopicFactory, job_name: str
) -> Planning:
    return Planning(migrated, kafka, topic_factory, job_name)


def _lease_until(engine: sa.Engine, db: DatabaseSettings, job: str) -> object:
    with engine.connect() as conn:
        return lock_job(conn, db, job, for_update=False).lease_until


def test_a_plan_that_moves_nothing_is_one_statement(
    counted: tuple[sa.Engine, _Statements], planning: Planning
) -> None:
    engine, statements = counted
    topic, run = planning.started(engine, {0: 5, 1: 2})
    first = planning.plan(engine, run, topic)  # seeds the rows: the plan's transaction
    assert offsets_of(engine, planning.db, planning.job) == {(topic, 0): 0, (topic, 1): 0}
    before = _lease_until(engine, planning.db, planning.job)
    statements.seen.clear()
    again = planning.plan(engine, run, topic)
    assert len(statements.seen) == 1 and statements.seen[0].startswith("WITH renewed AS"), statements.seen
    assert again == first  # the same plan, the same stored offsets
    assert [(r.partition, r.start, r.until) for r in again.ranges] == [(0, 0, 3), (1, 0, 2)]
    assert _lease_until(engine, planning.db, planning.job) > before  # type: ignore[operator]  # renewed


def test_what_must_be_moved_or_pruned_takes_the_plans_transaction(
    counted: tuple[sa.Engine, _Statements], planning: Planning
) -> None:
    engine, statements = counted
    topic, run = planning.started(engine, {0: 4})
    planning.plan(engine, run, topic)
    # a partition added: seeded (at its log start) by the plan's transaction
    admin = AdminClient({"bootstrap.servers": planning.kafka.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    # the controller's answer comes before the broker lists the partition: a plan in between saw
    # the description's 2 partitions and a metadata answer of 1 (TopicMissing, CI once)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < 2:
        assert time.monotonic() < deadline, f"{topic}[1] is not listed 30 s after it was created"
        time.sleep(0.1)
    produce_counts(planning.kafka.bootstrap_servers, topic, {1: 1})
    statements.seen.clear()
    plan = planning.plan(engine, run, topic)
    assert offsets_of(engine, planning.db, planning.job) == {(topic, 0): 0, (topic, 1): 0}
    assert [(r.partition, r.until) for r in plan.ranges] == [(0, 3), (1, 1)]
    assert len(statements.seen) > 1, statements.seen
    # a lineage prune due: the plan's transaction prunes (the fast path never does)
    lineage.forget_prunes()
    statements.seen.clear()
    planning.plan(engine, run, topic)
    assert any("DELETE" in s for s in statements.seen), statements.seen
    assert not lineage.prune_is_due(planning.db, planning.job)


def test_a_fenced_run_is_fenced_as_before(counted: tuple[sa.Engine, _Statements], planning: Planning) -> None:
    engine, _ = counted
    topic, run = planning.started(engine, {0: 2})
    planning.plan(engine, run, topic)
    newer = start_run(Store(engine, planning.db), planning.job, force=True)
    with pytest.raises(Fenced) as caught:
        planning.plan(engine, run, topic)
    assert caught.value.current == newer.generation  # type: ignore[attr-defined]
    assert _lease_until(engine, planning.db, planning.job) is not None  # the newer run's lease, untouched


def test_behind_a_transaction_pooler_the_one_statement_keeps_its_timeouts(
    pooled_database_url: str, engine: sa.Engine, planning: Planning
) -> None:
    """Through PgBouncer (transaction pooling) the session has no startup timeouts: the statement
    runs in a transaction that sets them (SET LOCAL), never bare - a job row held elsewhere makes
    the plan fail after lock_timeout, not wait for the holder."""
    db = DatabaseSettings(Secret(pooled_database_url), schema=planning.db.schema, lock_timeout_s=1.0)
    pooled = engine_for(db)
    statements = _Statements(pooled)
    try:
        topic, run = planning.started(pooled, {0: 3}, db=db)
        planning.plan(pooled, run, topic, db=db)
        statements.seen.clear()
        plan = planning.plan(pooled, run, topic, db=db)
        assert [(r.partition, r.start, r.until) for r in plan.ranges] == [(0, 0, 3)]
        assert len(statements.seen) == 1 and statements.seen[0].startswith("WITH renewed AS")
        with engine.connect() as holder:  # a direct session holds the job row (as a new run would)
            lock_job(holder, planning.db, planning.job, for_update=True)
            with pytest.raises((TxnOffsetsError, sa.exc.DBAPIError)) as caught:
                planning.plan(pooled, run, topic, db=db)
            holder.rollback()
        assert "lock" in str(caught.value).lower(), caught.value
    finally:
        pooled.dispose()


def test_a_running_jobs_statement_goes_out_while_kafka_answers(
    planning: Planning, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's Kafka requests and its one statement overlap (one wait, not two): here Kafka's
    answer is held until the statement has run. Planned one after the other, the plan would wait
    out the hold (10 s) and fail the check."""
    engine = engine_for(planning.db)
    topic, run = planning.started(engine, {0: 5, 1: 2})
    planning.plan(engine, run, topic)  # seeds the rows
    sent = threading.Event()
    renew = planner.renew_and_load
    ask = metadata.topics_and_watermarks

    def renewing(*args: Any, **kwargs: Any) -> Any:
        out = renew(*args, **kwargs)
        sent.set()
        return out

    def asking(*args: Any, **kwargs: Any) -> Any:
        answer = ask(*args, **kwargs)
        assert sent.wait(10), "the statement waited for Kafka's answer"
        return answer

    monkeypatch.setattr(planner, "renew_and_load", renewing)
    monkeypatch.setattr(metadata, "topics_and_watermarks", asking)
    try:
        plan = planning.plan(engine, run, topic)
    finally:
        engine.dispose()
    assert sent.is_set()
    assert {(r.partition, r.start, r.until) for r in plan.ranges} == {(0, 0, 3), (1, 0, 2)}


def test_only_the_lease_renewal_commits_without_waiting_for_the_disk(
    counted: tuple[sa.Engine, _Statements], planning: Planning
) -> None:
    """The one statement's commit does not wait for its WAL to reach the disk (a lease renewal lost
    to a crash only makes the lease look older: nothing depends on it being durable), and that
    setting stays in its own transaction: a range's commit, results and offset, still waits."""
    engine, _ = counted
    topic, run = planning.started(engine, {0: 3})
    planning.plan(engine, run, topic)  # seeds the row
    with engine.connect() as conn:
        with conn.begin():
            found = renew_and_load(conn, planning.db, [run]).get(run.job)
            assert found is not None and found[1][(topic, 0)].off == 0
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    settings: list[str] = []

    def write(conn: sa.Connection) -> None:  # inside the range's claim transaction
        settings.append(str(conn.exec_driver_sql("SHOW synchronous_commit").scalar()))

    planning.plan(engine, run, topic)  # a quick plan on the pool's connections first
    outcomes = commit_ranges(Store(engine, planning.db), run, [OffsetRange(topic, 0, 0, 3)], write)
    assert [o.outcome for o in outcomes] == [Outcome.COMMITTED] and settings == ["on"]
    assert offsets_of(engine, planning.db, planning.job) == {(topic, 0): 3}


def test_the_one_statement_reads_the_rows_the_plans_transaction_reads(
    counted: tuple[sa.Engine, _Statements], planning: Planning
) -> None:
    """Its rows come back a row per topic incarnation (arrays of partitions and offsets): every row
    of every topic, rows stored before topic ids were kept among them, as load_rows reads them;
    a job without rows yet has none and has not planned."""
    engine, _ = counted
    first, second = planning.topic_factory(partitions=3), planning.topic_factory(partitions=2)
    produce_counts(planning.kafka.bootstrap_servers, first, {0: 4, 1: 1, 2: 0})
    produce_counts(planning.kafka.bootstrap_servers, second, {0: 2, 1: 6})
    run = start_run(Store(engine, planning.db), planning.job)
    with engine.connect() as conn, conn.begin():
        assert renew_and_load(conn, planning.db, [run]).get(run.job) == (False, {})
    plan_batch(
        Store(engine, planning.db),
        planning.kafka,
        job=planning.job,
        selection=TopicSelection((first, second)),
        start=StartPolicy.latest(),
        limits=Limits(),
        run=run,
    )
    offsets = tables_for(planning.db.schema).offsets
    with engine.begin() as conn:  # one row of `first` as stored before topic ids were kept
        conn.execute(
            sa.update(offsets)
            .where(offsets.c.job == planning.job, offsets.c.topic == first, offsets.c.part == 1)
            .values(topic_id=None)
        )
    with engine.connect() as conn, conn.begin():
        found = renew_and_load(conn, planning.db, [run]).get(run.job)
        assert found is not None
        assert found == (True, load_rows(conn, planning.db, planning.job))
    rows = found[1]
    assert {tp: row.off for tp, row in rows.items()} == {
        (first, 0): 4,
        (first, 1): 1,
        (first, 2): 0,
        (second, 0): 2,
        (second, 1): 6,
    }
    assert rows[(first, 1)].topic_id is None and rows[(first, 0)].topic_id is not None
