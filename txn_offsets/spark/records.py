"""What a task does to the records it reads, before its transaction: the user's decoder (a failure
rejects the record, or dead-letters it) and the count and timestamps of the records that pass."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from txn_offsets.errors import RecordRejected
from txn_offsets.kafka.reader import Record
from txn_offsets.store.dead_letters import DeadLetter

__all__ = ["Counting", "decoded"]

T = TypeVar("T")


def decoded(
    records: Iterable[Record], decode: Callable[[Record], T], dead: list[DeadLetter] | None = None
) -> Iterator[T]:
    """Apply the user's decoder. A failure rejects the batch naming the record (topic, partition,
    offset), or, when `dead` is a list, is appended to it and the record is skipped.

    The error names the exception type only: a decoder's message often quotes the record
    (``invalid literal for int(): b'...'``), and errors travel to logs and Spark task failures. The
    full message is kept with the record in the dead-letter table, which holds the payload anyway.
    """
    for rec in records:
        try:
            yield decode(rec)
        except Exception as exc:  # any decoder failure rejects the record
            if dead is None:
                raise RecordRejected(
                    rec.topic, rec.partition, rec.offset, f"{type(exc).__name__} (message not shown)"
                ) from None
            dead.append(DeadLetter(rec, f"{type(exc).__name__}: {exc}"[:2000]))


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
