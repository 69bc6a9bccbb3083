"""What a claim's outcome means: pure classification functions of the protocol (no I/O).

A guarded claim that moved no row, or a transaction that ended without a clear answer (a lost
COMMIT acknowledgement, a serialization failure), is classified from the rows read afterwards.
Being pure, these decisions are property-tested (tests/unit/test_store_classify.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from txn_offsets.errors import (
    Fenced,
    OffsetConflict,
    OffsetsMovedOn,
    OffsetsRolledBack,
    TopicChanged,
    UnknownJob,
)
from txn_offsets.ranges import OffsetRange, TopicPartition

__all__ = [
    "ClaimResult",
    "FoundRow",
    "Settled",
    "classify_claim",
    "classify_claims",
    "classify_reread",
    "transaction_outcome",
]


class ClaimResult(enum.StrEnum):
    """What a guarded claim did."""

    CLAIMED = "claimed"  # the row moved from the range's start to its end in this transaction
    ALREADY_COMMITTED = "already_committed"  # the row is already at the range's end


class Settled(enum.StrEnum):
    """Where the rows of a batch were found after its transaction ended without a clear answer."""

    AT_UNTIL = "at_until"  # every range is committed (by this attempt or by a duplicate)
    AT_START = "at_start"  # nothing of the batch was committed


def _same_topic(rng: OffsetRange, found_topic_id: str | None) -> bool:
    """A range planned from a known topic id only matches a row of that same incarnation."""
    return rng.topic_id is None or found_topic_id == rng.topic_id


def classify_claim(
    job: str,
    rng: OffsetRange,
    found_off: int | None,
    found_generation: int | None,
    my_generation: int,
    *,
    found_topic_id: str | None = None,
) -> ClaimResult:
    """Classify a claim that updated no row, from the row re-read afterwards.

    A newer generation wins over everything (this run must stop); then a row of another topic
    incarnation than the range was planned from is TopicChanged (transient: plan again); then
    ``off == until`` means this exact range was committed before (a retry, a speculative copy);
    ``off < start`` means the database lost commits under this run (OffsetsRolledBack, transient:
    plan again); ``off > start`` means a task of this run committed there after the range was
    planned (OffsetsMovedOn, transient: plan again - only this run's tasks write under its
    generation); no row at all is a conflict that must not be retried into success.
    """
    if found_generation is None:
        raise UnknownJob(job)
    if found_generation != my_generation:
        raise Fenced(job, my_generation, found_generation)
    if rng.topic_id is not None and not _same_topic(rng, found_topic_id):
        raise TopicChanged(rng.topic, rng.topic_id, found_topic_id, in_store=True)
    if found_off == rng.until:
        return ClaimResult.ALREADY_COMMITTED
    if found_off is not None and found_off < rng.start:
        raise OffsetsRolledBack(job, rng.topic, rng.partition, rng.start, found_off)
    if found_off is not None:  # past the start at our generation: a task of this run committed there
        raise OffsetsMovedOn(job, rng.topic, rng.partition, rng.start, found_off)
    raise OffsetConflict(job, rng.topic, rng.partition, rng.start, found_off)


class FoundRow(NamedTuple):
    """What a multi-range claim found for one range: whether it moved the row, and the row's
    offset and topic id (None: no row, or not locked because the run was fenced)."""

    claimed: bool
    off: int | None
    topic_id: str | None


def classify_claims(
    job: str,
    ranges: Sequence[OffsetRange],
    found: Sequence[FoundRow],
    found_generation: int | None,
    my_generation: int,
) -> list[ClaimResult]:
    """:func:`classify_claim` of each range of a one-statement claim, in order: what claiming them
    one after another would give (the first range that cannot be claimed raises)."""
    if len(found) != len(ranges):
        raise ValueError(f"{len(found)} claim results for {len(ranges)} ranges")
    return [
        ClaimResult.CLAIMED
        if f.claimed
        else classify_claim(job, r, f.off, found_generation, my_generation, found_topic_id=f.topic_id)
        for r, f in zip(ranges, found, strict=True)
    ]


def transaction_outcome(
    job: str, ranges: Sequence[OffsetRange], results: Sequence[ClaimResult]
) -> ClaimResult:
    """What the claims of one transaction's ranges come to: CLAIMED when every range was claimed
    (write, then commit), ALREADY_COMMITTED when every range was (roll back, write nothing); some
    of each is OffsetConflict on the first committed range: a transaction is never half-applied."""
    if all(r is ClaimResult.CLAIMED for r in results):
        return ClaimResult.CLAIMED
    if all(r is ClaimResult.ALREADY_COMMITTED for r in results):
        return ClaimResult.ALREADY_COMMITTED
    # committed by another task of this run (the claims' generation is ours): its batch was
    # planned with other ranges - one that failed, whose task still reached its COMMIT
    done = ranges[list(results).index(ClaimResult.ALREADY_COMMITTED)]
    raise OffsetsMovedOn(job, done.topic, done.partition, done.start, done.until)


def classify_reread(
    job: str,
    ranges: Sequence[OffsetRange],
    found: Mapping[TopicPartition, int | None],
    found_generation: int | None,
    my_generation: int,
    *,
    found_topic_ids: Mapping[TopicPartition, str | None] | None = None,
) -> Settled:
    """Classify a batch whose transaction ended without a clear answer (lost COMMIT, 40001).

    All rows at their range's end (and of the incarnation each range was planned from) means the
    batch is committed (a committed batch stays committed even if a newer run started since); all
    at their start means nothing happened. Anything in between is a conflict, reported on the
    range that explains it best.
    """
    ids = found_topic_ids or {}

    def same(r: OffsetRange) -> bool:
        return r.topic_id is None or _same_topic(r, ids.get(r.key))

    if ranges and all(found.get(r.key) == r.until and same(r) for r in ranges):
        return Settled.AT_UNTIL
    if found_generation is None:
        raise UnknownJob(job)
    if found_generation != my_generation:
        raise Fenced(job, my_generation, found_generation)
    moved = next((r for r in ranges if not same(r)), None)
    if moved is not None and moved.topic_id is not None:
        raise TopicChanged(moved.topic, moved.topic_id, ids.get(moved.key), in_store=True)
    if all(found.get(r.key) == r.start for r in ranges):
        return Settled.AT_START
    odd = [r for r in ranges if found.get(r.key) not in (r.start, r.until)]
    behind = next((r for r in odd if (off := found.get(r.key)) is not None and off < r.start), None)
    if behind is not None:  # the database lost commits under this run: plan again
        raise OffsetsRolledBack(job, behind.topic, behind.partition, behind.start, found[behind.key] or 0)
    worst = odd[0] if odd else next(r for r in ranges if found.get(r.key) != r.start)
    raise OffsetConflict(job, worst.topic, worst.partition, worst.start, found.get(worst.key))
