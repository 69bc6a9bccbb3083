"""A job catching up plans its next batch from the last one's plan (no round trip: runner's
REPLAN_EVERY_S, planner.plan_next), and the claims' guard holds those batches as it holds any: the
job is exact, and a newer run fences the old one's carried batch before it writes anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_counting_job import counting_writer, stored_offsets, totals
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits
from txn_offsets.spark import runner
from txn_offsets.spark.many import run_jobs
from txn_offsets.spark.summary import BatchReport
from txn_offsets.store.database import engine_for
from txn_offsets.store.runs import start_run


@pytest.fixture
def fresh_plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fresh plans of the runner (its own or a joint one), one entry each; carried plans make
    none. REPLAN_EVERY_S is made long, so that a slow machine does not make the count vary."""
    made: list[int] = []
    fresh_plan = runner._fresh_plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return fresh_plan(*args, **kwargs)

    monkeypatch.setattr(runner, "_fresh_plan", counted)
    monkeypatch.setattr(runner, "REPLAN_EVERY_S", 3600.0)
    return made


def test_a_job_catching_up_plans_from_its_last_batch_and_stays_exact(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    fresh_plans: list[int],
) -> None:
    topic = topic_factory(partitions=4)
    expected = produce(topic, 10_000, 4)
    summary = run_test_job(counting_writer(counts_table), [topic], limits=Limits(max_records_per_batch=1_000))
    assert summary.batches == 10 and summary.records == 10_000
    # the first plan, then nine carried ones while each filled its batch; the last (fresh) found
    # nothing more to read
    assert len(fresh_plans) == 2
    assert totals(engine, counts_table) == dict(expected)
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)


def test_a_carried_batch_of_a_fenced_run_writes_nothing(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    fresh_plans: list[int],
) -> None:
    topic = topic_factory(partitions=2)
    produce(topic, 4_000, 2)
    eng = engine_for(db)
    newer: list[int] = []

    def deploy_a_newer_run(report: BatchReport) -> None:  # after the first batch committed
        if not newer:
            newer.append(start_run(eng, db, job_name, force=True).generation)

    on_batch: Callable[[BatchReport], None] = deploy_a_newer_run
    with pytest.raises(Fenced) as fenced:
        run_test_job(
            counting_writer(counts_table),
            [topic],
            limits=Limits(max_records_per_batch=1_000),
            on_batch=on_batch,
        )
    eng.dispose()
    assert len(fresh_plans) == 1  # the second batch was carried: its claims met the fence
    assert fenced.value.current == newer[0]
    assert sum(totals(engine, counts_table).values()) == 1_000  # the first batch, once
    assert sum(stored_offsets(engine, db, job_name).values()) == 1_000


def test_jobs_in_shared_rounds_carry_their_plans_and_stay_exact(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    fresh_plans: list[int],
) -> None:
    """Under run_jobs a job whose last batch was full plans the next from it, without the round's
    joint planner; its batches still share the rounds' Spark jobs and commits."""
    topics = [topic_factory(partitions=2) for _ in range(3)]
    expected = [produce(t, 3_000, 2, keys=31 + i) for i, t in enumerate(topics)]
    tables = [f'"{db.schema}".carried_{i}' for i in range(3)]
    with engine.begin() as conn:
        for table in tables:
            conn.execute(sa.text(f"CREATE TABLE {table} (k text PRIMARY KEY, n bigint NOT NULL)"))
    jobs = {
        f"{job_name}-{i}": {
            "kafka": kafka,
            "database": db,
            "writer": counting_writer(tables[i]),
            "topics": [topics[i]],
            "start": StartPolicy.earliest(),
            "limits": Limits(max_records_per_batch=500),
            "until_caught_up": True,
        }
        for i in range(3)
    }
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    assert [result.summaries[name].batches for name in jobs] == [6, 6, 6]
    assert len(fresh_plans) == 6  # per job: its first plan, five carried, a last fresh one
    assert result.round_batches == 18
    for i, name in enumerate(jobs):
        assert totals(engine, tables[i]) == dict(expected[i])
        assert stored_offsets(engine, db, name) == settled_ends(kafka, topics[i], 2)
