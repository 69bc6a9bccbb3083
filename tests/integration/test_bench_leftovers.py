"""make bench starts from a result table without the rows of benchmark topics that are gone: every
contender writes the one table, and rows an interrupted run or a scratch script left there slowed
them all (benchmarks.sink.remove_leftovers). Rows of any other topic, and of a bench topic Kafka
still has, are kept."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.dataset import create_topic, delete_topics
from examples import migrate as examples_migrate
from examples.schema import window_counts
from tests.fix_services import Services
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.redaction import Secret


def _rows(topic: str, n: int) -> list[dict[str, object]]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        {
            "topic": topic,
            "window_start": start + dt.timedelta(minutes=i),
            "page": "/p",
            "views": 1,
            "duration_ms": 5,
        }
        for i in range(n)
    ]


def _count(engine: sa.Engine, topic: str) -> int:
    query = sa.select(sa.func.count()).select_from(window_counts).where(window_counts.c.topic == topic)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def test_rows_of_deleted_bench_topics_go_and_the_others_stay(services: Services, engine: sa.Engine) -> None:
    examples_migrate.upgrade(DatabaseSettings(Secret(services.database_url)))
    kafka = KafkaSettings(services.kafka_bootstrap)
    live = create_topic(kafka, 1)
    gone = [f"bench-p8-{uuid.uuid4().hex[:8]}", f"bench-latency-p8-{uuid.uuid4().hex[:8]}"]
    other = f"demo-{uuid.uuid4().hex[:8]}"  # not a benchmark's name: never touched
    lookalike = f"bench-p8-{uuid.uuid4().hex[:8]}x"  # not create_topic's name either
    kept = [live, other, lookalike]
    try:
        with engine.begin() as conn:
            for topic in (*gone, *kept):
                conn.execute(sa.insert(window_counts), _rows(topic, 3))
        deleted, topics, rest = sink.remove_leftovers(engine, kafka)
        assert [_count(engine, t) for t in gone] == [0, 0]
        assert [_count(engine, t) for t in kept] == [3, 3, 3]
        # other tests' leftovers may have gone in the same call: at least ours
        assert deleted >= 6 and topics >= 2
        assert rest >= 9
        assert sink.remove_leftovers(engine, kafka) == (0, 0, rest)  # nothing more to remove
    finally:
        with engine.begin() as conn:
            conn.execute(sa.delete(window_counts).where(window_counts.c.topic.in_([*gone, *kept])))
        delete_topics(kafka, [live])
