"""run_jobs' one driver engine for many runs (txn_offsets.spark.spec.job_run's `engines`): a run
given it uses that engine and leaves it open, pooled, for the next run; a run on other database
settings, or given none, still makes (and closes) an engine of its own."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.store.database import engine_for


def _spec(topic: str) -> JobSpec:
    return JobSpec(job=f"shared-{uuid.uuid4().hex[:8]}", selection=TopicSelection((topic,), None))


def test_runs_share_the_engine_they_are_given(
    migrated: DatabaseSettings, kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    engine = engine_for(migrated, pool_size=4, max_overflow=0)
    engines = {migrated: engine}
    try:
        for _ in range(3):
            with job_run(_spec(topic), migrated, kafka, engines=engines) as (used, run):
                assert used.engine is engine and run.generation == 1
        # still open: the runs' connections went back to its pool, none was closed
        assert engine.pool.checkedin() >= 1  # type: ignore[attr-defined]
        opened = engine.pool.checkedin()  # type: ignore[attr-defined]
        # other settings (here: another application_name) are not this engine's
        other = dataclasses.replace(
            migrated,
            url=sa.engine.make_url(migrated.url)
            .update_query_dict({"application_name": "other"})
            .render_as_string(hide_password=False),
        )
        with job_run(_spec(topic), other, kafka, engines=engines) as (used, _):
            assert used.engine is not engine
        assert engine.pool.checkedin() == opened  # type: ignore[attr-defined]
        with job_run(_spec(topic), migrated, kafka) as (used, _):  # given no engines: its own
            assert used.engine is not engine
    finally:
        engine.dispose()
