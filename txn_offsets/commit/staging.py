"""The staging rules: what every unit builder does between a range's read and its commit.

1. The user's ``prepare`` (decode + aggregate) sees every record of the range, and what it returns
   is materialised before the records are drained: a range whose records it did not all read is
   RecordsNotConsumed, never a commit (committing would move the offset past records nobody saw).
2. A rejected record (RecordRejected from the decoder) stops its group: the ranges staged before
   it are committed, it and the ranges after it are not.
3. Dead letters (records the decoder refused, with ``dead_letters`` on) are written in the same
   transaction as the ranges' results, so they are stored exactly once too.

PartitionWriter tasks (both execution paths, shared rounds) and low-latency followers stage their
ranges here, then build their unit with :func:`unit_of`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import sqlalchemy as sa

from txn_offsets.commit.proof import Source
from txn_offsets.commit.unit import Unit
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import RecordRejected, RecordsNotConsumed
from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.dead_letters import DeadLetter, write_dead_letters
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run

__all__ = ["Counting", "Prepare", "Prepared", "RangesWrite", "Stop", "prepare_range", "unit_of"]

A = TypeVar("A")

#: the user's decode + aggregate of one range's records (dead letters appended to the list, if any)
Prepare = Callable[[Iterator[Record], list[DeadLetter] | None], A]
#: the writer's write of a transaction's prepared ranges, on its connection
RangesWrite = Callable[[sa.Connection, Sequence[tuple[OffsetRange, A]]], None]


class Counting(Iterator[Record]):
    """Counts the records that pass through (for the batch log line) and keeps the first and last
    record timestamp (for the lineage row)."""

    def __init__(self, inner: Iterator[Record]) -> None:
        self._inner = inner
        self.n = 0
        self.first_ms: int | None = None
        self.last_ms: int | None = None

    def __iter__(self) -> Counting:
        return self

    def __next__(self) -> Record:
        rec = next(self._inner)
        self.n += 1
        if rec.timestamp_ms is not None:
            if self.first_ms is None:
                self.first_ms = rec.timestamp_ms
            self.last_ms = rec.timestamp_ms
        return rec

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def unread(self) -> bool:
        """True if records are left that nobody read (the reader is closed either way)."""
        try:
            next(self._inner)
        except StopIteration:
            return False
        self.close()
        return True


@dataclass(frozen=True)
class Prepared(Generic[A]):
    """A range read and prepared, waiting for its transaction."""

    range: OffsetRange
    value: A
    dead: list[DeadLetter] | None
    records: int
    stamps: tuple[int | None, int | None]  # the first and last record timestamp (lineage)


@dataclass(frozen=True)
class Stop:
    """A range that stops its group (rule 1 or 2): the error, and the records read before it."""

    range: OffsetRange
    error: RecordRejected | RecordsNotConsumed
    records: int


def prepare_range(
    rng: OffsetRange, records: Iterator[Record], prepare: Prepare[A], *, dead_letters: bool
) -> Prepared[A] | Stop:
    """Run `prepare` over the range's records (all of them, in offset order): the prepared range,
    or the Stop that ends its group."""
    counted = Counting(records)
    try:
        dead: list[DeadLetter] | None = [] if dead_letters else None
        value = prepare(counted, dead)
    except RecordRejected as exc:
        counted.close()
        return Stop(rng, exc, counted.n)
    if counted.unread():
        return Stop(rng, RecordsNotConsumed(rng.topic, rng.partition, rng.start, rng.until), counted.n)
    return Prepared(rng, value, dead, counted.n, (counted.first_ms, counted.last_ms))


def unit_of(
    run: Run,
    database: DatabaseSettings,
    prepared: Sequence[Prepared[A]],
    write: RangesWrite[A],
    *,
    source: Source,
    batch: int | None,
) -> Unit:
    """What one transaction commits for the `prepared` ranges: the claims, the writer's write of
    them all and their dead letters (rule 3), the lineage (batch number, record timestamps)."""

    def write_all(conn: sa.Connection) -> None:
        write(conn, [(p.range, p.value) for p in prepared])  # the writer's, all in this transaction
        for p in prepared:
            if p.dead:
                write_dead_letters(conn, database, run.job, p.dead)

    stamps = {p.range.key: p.stamps for p in prepared}
    return Unit(run, [p.range for p in prepared], write_all, Lineage(batch, stamps), source=source)
