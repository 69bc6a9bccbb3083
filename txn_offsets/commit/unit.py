"""What every mode hands the commit shell: a unit (one run's ranges, their write, where they were
read) and what each range came to (an Outcome).

A unit is built by a mode's unit builder once its ranges' records were read and prepared
(:mod:`txn_offsets.commit.staging` holds the rules every builder follows); the shell
(:mod:`txn_offsets.commit.shell`) claims, writes, proves and commits it, alone or with others.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from txn_offsets.commit.proof import Source
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run

__all__ = ["ISOLATION_LEVELS", "Outcome", "RangeOutcome", "TransactionWrite", "Unit", "describe"]

ISOLATION_LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")

#: what the transaction runs after a unit's claims, on its connection
TransactionWrite = Callable[[sa.Connection], None]


class Outcome(enum.StrEnum):
    """What happened to a range. The first two are success (its records applied exactly once);
    the others name the error a task reports instead of raising (each error class's ``outcome``)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"
    CONFLICT = "conflict"
    FENCED = "fenced"
    TOPIC_CHANGED = "topic_changed"
    ROLLED_BACK = "rolled_back"
    BLOCKED = "blocked"
    ABORTED = "aborted"
    WRITE_FAILED = "write_failed"
    REJECTED = "rejected"
    NOT_CONSUMED = "not_consumed"
    DATA_LOSS = "data_loss"

    @property
    def success(self) -> bool:
        return self in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED)


@dataclass(frozen=True)
class RangeOutcome:
    range: OffsetRange
    outcome: Outcome


@dataclass(frozen=True)
class Unit:
    """One run's ranges, committed together: claimed under the run's generation, written by
    `write` in the same transaction, their lineage rows (`lineage`: the batch number, record
    timestamps), and `source`: the Kafka cluster the records were read from (their topics'
    incarnation is proven before COMMIT) or an explicit NoKafkaSource."""

    run: Run
    ranges: Sequence[OffsetRange]
    write: TransactionWrite | None = None
    lineage: Lineage | None = None
    source: Source = field(kw_only=True)


def describe(ranges: Sequence[OffsetRange]) -> str:
    """A short list of `ranges` for messages: the first five, and how many more."""
    shown = ", ".join(str(r) for r in ranges[:5])
    return shown + (f" (+{len(ranges) - 5} more)" if len(ranges) > 5 else "")
