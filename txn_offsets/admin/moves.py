"""The shape of a planned offset move, shared by ``offsets reset`` and ``offsets import``.

Both are made in two steps so that a front-end can always show the plan first: a plan reads (the
store, and Kafka where it needs to) and changes nothing; applying it re-checks it under the job
row's lock and writes the offsets, their audit rows and the generation bump in one transaction.

No move leaves the log: a target outside [log start, end] (the end at the readers' isolation
level, the LSO under read_committed) is refused or clamped by each command, and moved there only
with ``--allow-outside-log`` (``allow_outside_log=True``), which the audit reason records
(:func:`forced_reason`). A stored offset outside the log is not a position: the next run stops
with DataLoss (or skips, audited).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from txn_offsets.ranges import TopicPartition

__all__ = ["ALLOW_OUTSIDE_LOG", "MAX_OFFSET", "Move", "MovePlan", "forced_reason", "in_log", "outside_log"]

#: The largest offset a row can hold (PostgreSQL's bigint; Kafka's offsets are int64 too).
MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True)
class Move:
    """One partition of a plan: its stored offset when the plan was made, and where it goes."""

    topic: str
    partition: int
    old: int | None  # None: the partition has no stored offset yet
    new: int


@dataclass(frozen=True)
class MovePlan:
    """The moves of one job, and who held its lease when the plan was made."""

    job: str
    generation: int | None  # None: the job does not exist yet (an import creates it)
    steps: tuple[Move, ...]
    live_run: str | None  # the run holding the lease when the plan was made
    heartbeat_age_s: float
    # when the live run's lease expires unless renewed, and its length (None: no live run, unknown)
    lease_left_s: float | None = field(default=None, kw_only=True)
    lease_s: float | None = field(default=None, kw_only=True)

    def moved_since(self, current: Mapping[TopicPartition, int]) -> Move | None:
        """The first step whose partition no longer holds the offset the plan saw (`current`: the
        job's offsets now), or None when the plan still holds."""
        return next((s for s in self.steps if current.get((s.topic, s.partition)) != s.old), None)


ALLOW_OUTSIDE_LOG = "--allow-outside-log"


def in_log(offset: int, bounds: tuple[int, int]) -> bool:
    """Whether `offset` is a position in a log of (log start, end): both ends included (the end,
    the LSO under read_committed, is where a caught-up job reads next)."""
    return bounds[0] <= offset <= bounds[1]


def outside_log(topic: str, partition: int, offset: int, bounds: tuple[int, int]) -> str:
    """How an offset outside the log is named, in errors, plan notes and audit reasons."""
    side = "past the end of" if offset > bounds[1] else "below the start of"
    return f"{topic}[{partition}] offset {offset} is {side} the log [{bounds[0]}, {bounds[1]}]"


def forced_reason(reason: str, forced: Sequence[str]) -> str:
    """The audit reason of a move forced outside the log: the operator's reason, then what was
    forced (each partition, offset and the log's bounds when the plan was made)."""
    if not forced:
        return reason
    return f"{reason} [forced with {ALLOW_OUTSIDE_LOG}: {'; '.join(forced)}]"
