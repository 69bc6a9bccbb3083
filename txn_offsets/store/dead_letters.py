"""Dead letters: the records a job's decoder rejected, kept (in dead-letter mode) in the
``dead_letters`` table instead of failing the batch, written in the transaction that commits their
range (so a dead letter exists exactly when its range is committed)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.store.schema import tables_for

__all__ = ["DeadLetter", "Rejected", "write_dead_letters"]


class Rejected(Protocol):
    """What a dead letter keeps of its Kafka record (a :class:`txn_offsets.Record`)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class DeadLetter(NamedTuple):
    """A record the decoder rejected, kept (in dead-letter mode) instead of failing the batch."""

    record: Rejected
    error: str


def write_dead_letters(conn: sa.Connection, db: DatabaseSettings, job: str, dead: list[DeadLetter]) -> None:
    """Insert a range's dead letters in the range's transaction (one multi-row statement).

    A record rejected again (the range replayed after an audited reset) replaces its earlier dead
    letter instead of failing the range forever on the primary key.
    """
    if not dead:
        return
    table = tables_for(db.schema).dead_letters
    stmt = pg_insert(table)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["job", "topic", "part", "off"],
            set_={
                "key": stmt.excluded.key,
                "value": stmt.excluded.value,
                "error": stmt.excluded.error,
                "at": sa.func.now(),
            },
        ),
        [
            {
                "job": job,
                "topic": d.record.topic,
                "part": d.record.partition,
                "off": d.record.offset,
                "key": d.record.key,
                "value": d.record.value,
                "error": d.error,
            }
            for d in dead
        ],
    )
