"""Shared helpers for the Spark job tests: a migrated offsets schema, a producer of keyed data, a
runner of this test's job (`run_test_job`) and the two together as a counting job (`counting`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.counting import Counting, produce_keyed
from txn_offsets import JobSummary, StartPolicy, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.store import migrate


@pytest.fixture
def db(database_url: str, pg_schema: str) -> DatabaseSettings:
    settings = DatabaseSettings(database_url, schema=pg_schema)
    migrate.upgrade(settings)
    return settings


@pytest.fixture(scope="session")
def examples_schema(database_url: str) -> None:
    """The examples' result tables (their own schema and alembic history), checked for drift."""
    from examples import migrate as examples_migrate

    examples_migrate.upgrade(DatabaseSettings(database_url))
    examples_migrate.check(DatabaseSettings(database_url))


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


@pytest.fixture
def counts_table(engine: sa.Engine, db: DatabaseSettings) -> Iterator[str]:
    """A result table `<schema>.counts(k, n)` for counting jobs."""
    name = f'"{db.schema}".counts'
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {name} (k text PRIMARY KEY, n bigint NOT NULL)"))
    yield name


Produce = Callable[..., collections.Counter[str]]


@pytest.fixture
def produce(kafka_bootstrap: str) -> Produce:
    """produce(topic, n, partitions, keys=97, start=0) -> Counter of keys produced (and readable)."""

    def run(topic: str, n: int, partitions: int, keys: int = 97, start: int = 0) -> collections.Counter[str]:
        return produce_keyed(kafka_bootstrap, topic, n, partitions, keys, start)

    return run


RunTestJob = Callable[..., JobSummary]


@pytest.fixture
def run_test_job(spark: Any, kafka: KafkaSettings, db: DatabaseSettings, job_name: str) -> RunTestJob:
    """run_test_job(writer, topics=(), *, session=None, **overrides) -> run_job's summary.

    Runs this test's job (`job_name`, `db`, `kafka`) on the shared local `spark` session from the
    earliest offsets until caught up. Every run_job keyword overrides a default: job=, database=,
    start=None (no start policy: a restart, or offsets imported), until_caught_up=False, limits=...;
    session= runs on another Spark session (e.g. `connect_spark`)."""

    def run(writer: Any, topics: Sequence[str] = (), *, session: Any = None, **overrides: Any) -> JobSummary:
        options: dict[str, Any] = {
            "job": job_name,
            "kafka": kafka,
            "database": db,
            "start": StartPolicy.earliest(),
            "until_caught_up": True,
            **overrides,
        }
        return run_job(spark if session is None else session, writer=writer, topics=topics, **options)

    return run


@pytest.fixture
def counting(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    job_name: str,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    run_test_job: RunTestJob,
) -> Counting:
    """This test's counting job into `counts_table`: topics made and filled, runs, totals, offsets."""
    return Counting(engine, db, kafka, job_name, counts_table, topic_factory, produce, run_test_job)


@pytest.fixture
def counting_no_spark(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    job_name: str,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
) -> Counting:
    """`counting` for a test that runs no job on this process's Spark (no session is started for
    it): its `run` is refused."""

    def no_run(*args: Any, **kwargs: Any) -> JobSummary:
        raise AssertionError("counting_no_spark runs no job: ask for `counting`")

    return Counting(engine, db, kafka, job_name, counts_table, topic_factory, produce, no_run)
