"""What a task does to the records it reads, before its transaction: the user's decoder (a failure
rejects the record, or dead-letters it). The count and timestamps of the records that pass are
:class:`txn_offsets.commit.staging.Counting`'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from txn_offsets.errors import RecordRejected
from txn_offsets.kafka.records import Record
from txn_offsets.store.dead_letters import DeadLetter

__all__ = ["decoded"]

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
