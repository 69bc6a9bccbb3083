"""Offset ranges and the pure planning arithmetic (no I/O), easy to property-test.

A range is half-open: ``[start, until)``. ``start`` is the stored offset of the partition (the next
offset to read) and ``until`` is where the stored offset moves when the range commits. Offsets
inside a range are monotonic but not consecutive (transaction markers, aborted records and
compaction leave gaps), so nothing here ever counts records to find an end.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeGuard, get_args, overload

from txn_offsets.errors import ConfigError

__all__ = [
    "BATCH_SHARES",
    "BatchShare",
    "OffsetRange",
    "PackedRanges",
    "TopicPartition",
    "backlog_share",
    "check_share",
    "fair_share",
    "packed_ranges",
    "plan_ranges",
]

TopicPartition = tuple[str, int]

# How a batch cap is shared over partitions: "even" (water-filling, :func:`fair_share`) or
# "backlog" (in proportion to each partition's backlog, :func:`backlog_share`)
BatchShare = Literal["even", "backlog"]
BATCH_SHARES: tuple[BatchShare, ...] = get_args(BatchShare)


@dataclass(frozen=True, order=True, slots=True)
class OffsetRange:
    """The records of one partition a task reads and commits: offsets in ``[start, until)``.

    ``topic_id`` is the Kafka topic id the range was planned from (None: not known, e.g. a range
    built by hand). Offsets are only meaningful within one incarnation of a topic, so a planned
    range's claim requires the stored row to belong to that id, and the records read for it are
    proven to come from it by checking the id again after the read (ids are never reused). It is
    not part of equality or ordering: it describes where the range's offsets live.
    """

    topic: str
    partition: int
    start: int
    until: int
    topic_id: str | None = field(default=None, compare=False)
    #: (topic, partition), made once: a task of 2,048 ranges looked it up ~14 times a range (its
    #: reads, claim, classification and reports), 5 us a range as a property
    key: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.topic:
            raise ConfigError("topic", "is empty")
        if self.partition < 0:
            raise ConfigError("partition", f"must be >= 0, got {self.partition} for topic {self.topic!r}")
        if self.start < 0:
            raise ConfigError(
                "start offset", f"must be >= 0, got {self.start} for {self.topic}[{self.partition}]"
            )
        if self.until < self.start:
            raise ConfigError(
                "until offset",
                f"{self.until} is below the start {self.start} for {self.topic}[{self.partition}]; "
                f"a range never moves backwards",
            )
        if self.topic_id is not None and (not isinstance(self.topic_id, str) or not self.topic_id):
            raise ConfigError("topic_id", f"must be a non-empty string or None for topic {self.topic!r}")
        object.__setattr__(self, "key", (self.topic, self.partition))

    @property
    def span(self) -> int:
        """Upper bound on the number of records (the real count can be lower: gaps)."""
        return self.until - self.start

    @property
    def empty(self) -> bool:
        return self.until == self.start

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.start <= offset < self.until

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@[{self.start},{self.until})"

    @property
    def packed(self) -> PackedRange:
        """Its values as a plain tuple (``OffsetRange(*packed)`` builds it again)."""
        return (self.topic, self.partition, self.start, self.until, self.topic_id)

    def __reduce__(self) -> tuple[type[OffsetRange], PackedRange]:
        # slots: no __dict__ to copy; its values, checked again where it is unpickled (4,096 ranges
        # of a batch's task reports cross from the Python workers to the driver every batch)
        return (OffsetRange, self.packed)


def fair_share(spans: Mapping[TopicPartition, int], total: int) -> dict[TopicPartition, int]:
    """Split a total cap over partitions: water-filling, so no partition gets more than it has,
    small partitions get all they have, and the rest is shared evenly (deterministic order)."""
    if total < 0:
        raise ConfigError("max_records_per_batch", f"must be >= 0, got {total}")
    share: dict[TopicPartition, int] = dict.fromkeys(spans, 0)
    remaining = total
    pending = [k for _, k in sorted((v, k) for k, v in spans.items() if v > 0)]
    while pending and remaining > 0:
        each, extra = divmod(remaining, len(pending))
        if each == 0:
            # fewer records left than partitions: hand out one each, in key order
            for k in sorted(pending)[:extra]:
                share[k] += 1
            break
        smallest = pending[0]
        need = spans[smallest] - share[smallest]
        if need <= each:
            # the smallest partition can be satisfied completely
            share[smallest] += need
            remaining -= need
            pending.pop(0)
        else:
            for i, k in enumerate(sorted(pending)):
                share[k] += each + (1 if i < extra else 0)
            remaining = 0
    return share


def backlog_share(spans: Mapping[TopicPartition, int], total: int) -> dict[TopicPartition, int]:
    """Split a total cap over partitions in proportion to their backlogs (`spans`), as Spark's
    ``maxOffsetsPerTrigger`` does: every partition drains at the same rate, so a skewed topic's
    batches stay alike (no tail of batches that hold only its biggest partition) and event time
    moves on evenly across partitions.

    When everything fits, everyone gets all they have. Otherwise each partition with a backlog gets
    one offset first (none waits behind the others' backlog; when the cap is smaller than the
    number of such partitions, the largest backlogs get one each, ties in key order), and the rest
    is apportioned by largest remainder on the backlogs beyond that one: a share differs from its
    exact proportional quota by less than one offset. Deterministic; integer arithmetic only."""
    if total < 0:
        raise ConfigError("max_records_per_batch", f"must be >= 0, got {total}")
    share: dict[TopicPartition, int] = dict.fromkeys(spans, 0)
    live = sorted(k for k, v in spans.items() if v > 0)
    backlog = sum(spans[k] for k in live)
    if backlog <= total:
        share.update({k: spans[k] for k in live})
        return share
    if total < len(live):
        for k in sorted(live, key=lambda k: (-spans[k], k))[:total]:
            share[k] = 1
        return share
    # one each, then the rest (total - n) over the backlogs beyond that one (backlog - n > 0,
    # since backlog > total >= n); rest < beyond, so a floor never reaches its backlog
    rest, beyond = total - len(live), backlog - len(live)
    remainders = []
    for k in live:
        quota, remainder = divmod(rest * (spans[k] - 1), beyond)
        share[k] = 1 + quota
        remainders.append((-remainder, k))
    left = total - sum(share.values())
    for _, k in sorted(remainders)[:left]:
        share[k] += 1
    return share


def check_share(share: object) -> TypeGuard[BatchShare]:
    """Raise ConfigError naming ``batch_share`` unless `share` is one of :data:`BATCH_SHARES`."""
    if share not in BATCH_SHARES:
        raise ConfigError(
            "batch_share", f"must be one of {', '.join(map(repr, BATCH_SHARES))}, got {share!r}"
        )
    return True


def plan_ranges(
    stored: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    *,
    max_per_partition: int | None = None,
    max_total: int | None = None,
    share: BatchShare = "even",
    topic_ids: Mapping[str, str] | None = None,
) -> list[OffsetRange]:
    """The non-empty ranges of one batch: ``until = min(end, start + max_per_partition)``, then an
    optional total cap shared over the partitions, ``share``: "even" (:func:`fair_share`) or
    "backlog" (:func:`backlog_share`). Every partition in ``stored`` must have an end offset.
    ``topic_ids`` (topic -> Kafka topic id) are carried by the ranges (see :class:`OffsetRange`)."""
    if max_per_partition is not None and max_per_partition <= 0:
        raise ConfigError("max_records_per_partition", f"must be > 0, got {max_per_partition}")
    if max_total is not None and max_total <= 0:
        raise ConfigError("max_records_per_batch", f"must be > 0, got {max_total}")
    check_share(share)
    spans: dict[TopicPartition, int] = {}
    for key, start in stored.items():
        if key not in ends:
            raise ConfigError("partition", f"{key[0]}[{key[1]}] has a stored offset but no end offset")
        end = ends[key]
        # end < start happens when the LSO is behind a stored offset (e.g. a reset to 'latest' seen
        # under read_uncommitted): nothing to read, never a negative range.
        span = max(0, end - start)
        if max_per_partition is not None:
            span = min(span, max_per_partition)
        spans[key] = span
    if max_total is not None:
        spans = (backlog_share if share == "backlog" else fair_share)(spans, max_total)
    ids = topic_ids or {}
    ranges = [
        OffsetRange(key[0], key[1], stored[key], stored[key] + span, ids.get(key[0]))
        for key, span in spans.items()
        if span > 0
    ]
    # by (topic, partition), unique in a plan: the ranges' order, compared in C (the ranges' own
    # comparison is a Python call each: 5 ms for 4,096 ranges planned in order already)
    ranges.sort(key=_KEY)
    return ranges


_KEY = operator.attrgetter("key")

#: A range as plain values (topic, partition, start, until, topic id): how tasks carry their ranges
PackedRange = tuple[str, int, int, int, str | None]


def packed_ranges(ranges: Sequence[OffsetRange]) -> tuple[PackedRange, ...]:
    """`ranges` as plain tuples, for pickling: cloudpickle (Spark's pickler for task functions)
    makes a Python call per object it is not built to handle, a dataclass among them - 18 ms for a
    batch's 4,096 ranges on an idle driver, 0.8 ms as tuples (:class:`PackedRanges` undoes it)."""
    return tuple(r.packed for r in ranges)


class PackedRanges(Sequence[OffsetRange]):
    """The ranges :func:`packed_ranges` packed, each built (and checked again) the first time it is
    looked up: a Spark task gets its batch's ranges and reads only its own group's - building all
    of them was 7 % of a Python worker's time at 4,096 partitions (two tasks of 2,048 ranges each).
    Equal to any sequence of the same ranges."""

    __slots__ = ("_built", "_packed")

    def __init__(self, packed: Iterable[PackedRange]) -> None:
        self._packed = tuple(packed)
        self._built: list[OffsetRange | None] = [None] * len(self._packed)

    def __len__(self) -> int:
        return len(self._packed)

    @overload
    def __getitem__(self, index: int) -> OffsetRange: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[OffsetRange, ...]: ...

    def __getitem__(self, index: int | slice) -> OffsetRange | tuple[OffsetRange, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        built = self._built[index]
        if built is None:
            built = self._built[index] = OffsetRange(*self._packed[index])
        return built

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PackedRanges({len(self)} ranges)"
