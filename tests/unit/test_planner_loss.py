"""The planner's data-loss rule (pure): a stored offset is good only inside the log of the same
topic incarnation; anything else is data loss with where an audited skip continues."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.plan.data_loss import lost as _lost
from txn_offsets.store.offset_rows import StoredOffset

offsets = st.integers(min_value=0, max_value=10**12)


@given(offsets, offsets, offsets)
def test_inside_the_log_of_the_same_topic_is_no_loss(a: int, b: int, c: int) -> None:
    low, off, end = sorted((a, b, c))
    assert _lost(StoredOffset(off, "id-1"), "id-1", (low, end)) is None
    assert _lost(StoredOffset(off, None), "id-1", (low, end)) is None  # stored before ids were kept


@given(offsets, offsets, offsets)
def test_another_topic_id_is_always_recreated(a: int, b: int, c: int) -> None:
    low, end = sorted((a, b))
    # even when the new log has grown past the stored offset (only the id tells it apart)
    assert _lost(StoredOffset(c, "old"), "new", (low, end)) == ("recreated", low)


@given(offsets, offsets, st.integers(min_value=1, max_value=10**6))
def test_above_the_end_is_truncated_and_below_the_start_is_retention(a: int, b: int, gap: int) -> None:
    low, end = sorted((a, b))
    assert _lost(StoredOffset(end + gap, "id"), "id", (low, end)) == ("truncated", end)
    if low >= gap:
        assert _lost(StoredOffset(low - gap, "id"), "id", (low, end)) == ("retention", low)
