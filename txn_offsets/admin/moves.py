"""The shape of a planned offset move, shared by ``offsets reset`` and ``offsets import``.

Both are made in two steps so that a front-end can always show the plan first: a plan reads (the
store, and Kafka where it needs to) and changes nothing; applying it re-checks it under the job
row's lock and writes the offsets, their audit rows and the generation bump in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from txn_offsets.ranges import TopicPartition

__all__ = ["Move", "MovePlan"]


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

    def moved_since(self, current: Mapping[TopicPartition, int]) -> Move | None:
        """The first step whose partition no longer holds the offset the plan saw (`current`: the
        job's offsets now), or None when the plan still holds."""
        return next((s for s in self.steps if current.get((s.topic, s.partition)) != s.old), None)
