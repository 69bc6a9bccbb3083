"""A run plans its next batch while the last one runs (spark.ahead.PlanAhead): only the first plan
(it seeds) is made after its batch; every later one, and the plan that finds the run caught up,
from the rows read during the batch before and Kafka's watermarks after it. The job stays exact,
and a failed batch falls back to the plan made as always."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.integration.spark.test_counting_job import counting_writer, stored_offsets, totals
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.planner import Limits
from txn_offsets.spark import runner


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The jobs of every plan_batch call of the runner (the real plan_batch runs)."""
    made: list[str] = []
    real = runner.plan_batch

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs["job"])
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "plan_batch", counted)
    return made


def test_batches_after_the_first_are_planned_ahead_and_exact(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    plans_made: list[str],
) -> None:
    topic = topic_factory(partitions=4)
    expected = produce(topic, 1_200, 4)
    summary = run_test_job(
        counting_writer(counts_table), [topic], limits=Limits(max_records_per_partition=100)
    )
    assert summary.batches == 3 and summary.records == 1_200 and summary.stopped_by == "caught_up"
    assert totals(engine, counts_table) == dict(expected)
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)
    # 4 plans (3 batches, then caught up): only the first, which seeds, was made after its batch...
    assert plans_made == [job_name]
    # ...and a later run of the job (no seeding) plans its first batch as always, the rest ahead
    produce(topic, 800, 4)
    again = run_test_job(counting_writer(counts_table), [topic], limits=Limits(max_records_per_partition=100))
    assert again.batches == 2 and again.records == 800
    assert plans_made == [job_name, job_name]
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 4)
