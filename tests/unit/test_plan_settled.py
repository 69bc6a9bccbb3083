"""planner.plan_settled (pure): the plan made from rows read while nothing needs moving - the one
plan_from makes from them, with the ranges of a batch in flight planned from their ends; None
wherever plan_batch would move an offset, and wherever a row of the batch in flight is at neither
end of its range."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.planner import Limits, plan_from, plan_settled
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.offset_rows import StoredOffset

pytestmark = pytest.mark.unit

T = "t"
IDS = {T: "id-1"}
LIMITS = Limits(max_records_per_partition=50)


@st.composite
def logs(draw: st.DrawFn) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[tuple[str, int], int]]:
    """Partitions' (log start, end) and a stored offset inside each log."""
    n = draw(st.integers(min_value=1, max_value=6))
    marks, stored = {}, {}
    for p in range(n):
        low = draw(st.integers(min_value=0, max_value=1_000))
        end = draw(st.integers(min_value=low, max_value=low + 500))
        marks[(T, p)] = (low, end)
        stored[(T, p)] = draw(st.integers(min_value=low, max_value=end))
    return marks, stored


@given(logs(), st.data())
def test_rows_in_their_logs_plan_as_plan_from_and_a_batch_in_flight_from_its_ends(
    log: tuple[dict[tuple[str, int], tuple[int, int]], dict[tuple[str, int], int]], data: st.DataObject
) -> None:
    marks, stored = log
    parts = sorted(marks)
    rows = {tp: StoredOffset(off, "id-1") for tp, off in stored.items()}
    assert plan_settled(rows, parts, marks, LIMITS, IDS) == plan_from(stored, marks, parts, LIMITS, IDS)
    # a batch in flight over some partitions, each row read at its range's start or its end
    flight = [
        OffsetRange(T, p, stored[(T, p)], data.draw(st.integers(stored[(T, p)] + 1, marks[(T, p)][1])))
        for (_, p) in parts
        if stored[(T, p)] < marks[(T, p)][1] and data.draw(st.booleans())
    ]
    read = dict(rows)
    for r in flight:
        if data.draw(st.booleans()):  # committed before the rows were read
            read[r.key] = StoredOffset(r.until, "id-1")
    after = {**stored, **{r.key: r.until for r in flight}}
    want = plan_from(after, marks, parts, LIMITS, IDS)
    assert plan_settled(read, parts, marks, LIMITS, IDS, committing=flight) == want


def test_none_wherever_plan_batch_would_move_an_offset_or_the_batch_row_moved() -> None:
    parts = [(T, 0), (T, 1)]
    marks = {(T, 0): (0, 10), (T, 1): (5, 10)}
    good = {(T, 0): StoredOffset(2, "id-1"), (T, 1): StoredOffset(5, "id-1")}
    assert plan_settled(good, parts, marks, LIMITS, IDS) is not None
    for rows in (
        {(T, 0): good[(T, 0)]},  # a partition without a row: seed
        {**good, (T, 1): StoredOffset(5, None)},  # no topic id: adopt
        {**good, (T, 1): StoredOffset(3, "id-1")},  # below the log start: retention
        {**good, (T, 1): StoredOffset(11, "id-1")},  # past the end: truncated
        {**good, (T, 1): StoredOffset(6, "id-0")},  # another incarnation: re-created
    ):
        assert plan_settled(rows, parts, marks, LIMITS, IDS) is None, rows
    flight = [OffsetRange(T, 0, 2, 6)]
    assert plan_settled(good, parts, marks, LIMITS, IDS, committing=flight) is not None
    moved = {**good, (T, 0): StoredOffset(4, "id-1")}  # at neither end of the range in flight
    assert plan_settled(moved, parts, marks, LIMITS, IDS, committing=flight) is None
    gone = [OffsetRange(T, 7, 0, 1)]  # a partition of the batch no longer selected
    assert plan_settled(good, parts, marks, LIMITS, IDS, committing=gone) is None
    other = [OffsetRange(T, 0, 2, 6, topic_id="id-0")]  # planned from another incarnation
    assert plan_settled(good, parts, marks, LIMITS, IDS, committing=other) is None
