"""Helpers of the offset store tests (a result table, reading and seeding offsets)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from confluent_kafka import Producer

from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import offset_rows


class Aggregate:
    """A one-row result table in the test's schema; `write` is a commit_ranges writer adding 1."""

    def __init__(self, engine: sa.Engine, schema: str) -> None:
        self.engine = engine
        self.table = sa.Table(
            "agg",
            sa.MetaData(schema=schema),
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("n", sa.BigInteger, nullable=False),
        )
        self.calls = 0
        with engine.begin() as conn:
            self.table.create(conn)
            conn.execute(sa.insert(self.table).values(id=1, n=0))

    def write(self, conn: sa.Connection) -> None:
        self.calls += 1
        conn.execute(sa.update(self.table).where(self.table.c.id == 1).values(n=self.table.c.n + 1))

    def value(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(self.table.c.n)).scalar_one())


def offsets_of(engine: sa.Engine, db: DatabaseSettings, job: str) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return offset_rows.load_offsets(conn, db, job)


def seed(engine: sa.Engine, db: DatabaseSettings, job: str, offsets: dict[tuple[str, int], int]) -> None:
    with engine.begin() as conn:
        offset_rows.seed_offsets(conn, db, job, offsets, reason="test", actor="pytest")


Cli = Callable[..., tuple[int, str, str]]


def produce_counts(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """Produce counts[partition] small records to each partition of `topic`."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for part, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=f"v{i}".encode(), partition=part)
    assert producer.flush(30) == 0
    settled_ends(bootstrap, topic, counts)
