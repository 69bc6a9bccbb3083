"""Planning arithmetic: ranges, per-partition caps and the fair share of a batch cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.errors import ConfigError
from txn_offsets.ranges import OffsetRange, fair_share, plan_ranges

keys = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 7))
offsets = st.integers(0, 10**12)


@given(
    st.dictionaries(keys, st.tuples(offsets, st.integers(0, 10**6)), max_size=20),
    st.one_of(st.none(), st.integers(1, 10**6)),
    st.one_of(st.none(), st.integers(1, 10**7)),
)
def test_plan_ranges_properties(
    data: dict[tuple[str, int], tuple[int, int]], per_part: int | None, total: int | None
) -> None:
    stored = {k: start for k, (start, _) in data.items()}
    ends = {k: start + lag for k, (start, lag) in data.items()}
    ranges = plan_ranges(stored, ends, max_per_partition=per_part, max_total=total)
    by_key = {r.key: r for r in ranges}
    assert len(by_key) == len(ranges)  # at most one range per partition
    for key, start in stored.items():
        rng = by_key.get(key)
        if rng is None:
            continue
        assert rng.start == start  # a range always starts at the stored offset
        assert start < rng.until <= ends[key]  # never empty, never past the end
        if per_part is not None:
            assert rng.span <= per_part
    if total is not None:
        assert sum(r.span for r in ranges) <= total
        capped = {k: min(ends[k] - stored[k], per_part or 10**18) for k in stored}
        assert sum(r.span for r in ranges) == min(total, sum(capped.values()))
    else:
        capped = {k: min(ends[k] - stored[k], per_part or 10**18) for k in stored}
        assert {r.key: r.span for r in ranges} == {k: v for k, v in capped.items() if v > 0}


@given(st.dictionaries(keys, st.integers(0, 1000), max_size=16), st.integers(0, 5000))
def test_fair_share_is_fair(spans: dict[tuple[str, int], int], total: int) -> None:
    share = fair_share(spans, total)
    assert sum(share.values()) == min(total, sum(spans.values()))
    assert all(0 <= share[k] <= spans[k] for k in spans)
    # water-filling: a partition short of its span got at least as much as any other, minus one
    unsatisfied = [k for k in spans if share[k] < spans[k]]
    for k in unsatisfied:
        assert share[k] + 1 >= max(share.values())


def test_end_below_start_gives_no_range() -> None:
    assert plan_ranges({("t", 0): 10}, {("t", 0): 5}) == []


def test_stored_partition_without_end_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"t\[1\]"):
        plan_ranges({("t", 1): 0}, {})


@pytest.mark.parametrize(
    ("topic", "partition", "start", "until", "fragment"),
    [
        ("t", 0, -1, 5, "start offset"),
        ("t", 0, 5, 4, "until offset"),
        ("t", -1, 0, 1, "partition"),
        ("", 0, 0, 1, "topic"),
    ],
)
def test_bad_ranges_are_named(topic: str, partition: int, start: int, until: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        OffsetRange(topic, partition, start, until)


def test_range_membership_and_str() -> None:
    rng = OffsetRange("orders", 3, 10, 20)
    assert 10 in rng and 19 in rng and 20 not in rng and 9 not in rng
    assert str(rng) == "orders[3]@[10,20)"
    assert rng.span == 10 and not rng.empty


@pytest.mark.parametrize(("per_part", "total"), [(0, None), (None, 0), (-3, None)])
def test_bad_limits_are_rejected(per_part: int | None, total: int | None) -> None:
    with pytest.raises(ConfigError):
        plan_ranges({("t", 0): 0}, {("t", 0): 10}, max_per_partition=per_part, max_total=total)
