"""Planning arithmetic: ranges, per-partition caps and the fair share of a batch cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.errors import ConfigError
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange, backlog_share, fair_share, plan_ranges

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


@given(st.dictionaries(keys, st.integers(0, 10**9), max_size=16), st.integers(0, 10**7))
def test_backlog_share_is_proportional(spans: dict[tuple[str, int], int], total: int) -> None:
    share = backlog_share(spans, total)
    live = [k for k, v in spans.items() if v > 0]
    backlog = sum(spans.values())
    assert share.keys() == spans.keys()
    assert sum(share.values()) == min(total, backlog)
    assert all(0 <= share[k] <= spans[k] for k in spans)
    if backlog <= total:
        assert share == spans
    elif total >= len(live):
        # one offset each, then within one offset of the exact quota of the rest (as fractions:
        # |share - 1 - rest * (span - 1) / beyond| < 1)
        rest, beyond = total - len(live), backlog - len(live)
        for k in live:
            assert share[k] >= 1
            assert abs((share[k] - 1) * beyond - rest * (spans[k] - 1)) < beyond
    else:
        # fewer offsets than partitions: one each to the largest backlogs
        got = [k for k in live if share[k]]
        assert len(got) == total and all(share[k] == 1 for k in got)
        assert min((spans[k] for k in got), default=10**10) >= max(
            (spans[k] for k in live if k not in got), default=0
        )


def test_backlog_share_keeps_a_skewed_topic_batches_alike() -> None:
    # 22.7 % / 9.1 % skew, a cap of a third of the backlog: every partition gets a third of its own
    spans = {("t", 0): 227_000, ("t", 1): 91_000, ("t", 2): 182_000}
    share = backlog_share(spans, 166_667)
    assert sum(share.values()) == 166_667
    assert all(abs(share[k] - spans[k] / 3) <= 1 for k in spans)
    # water-filling gives the small partition its even third first and the big one the same
    assert fair_share(spans, 166_667)[("t", 0)] == 55_556


def test_plan_ranges_shares_the_batch_cap_by_backlog() -> None:
    stored = {("t", 0): 100, ("t", 1): 0}
    ends = {("t", 0): 400, ("t", 1): 100}
    ranges = plan_ranges(stored, ends, max_total=200, share="backlog")
    assert ranges == [OffsetRange("t", 0, 100, 250), OffsetRange("t", 1, 0, 50)]
    assert plan_ranges(stored, ends, max_total=200) == [
        OffsetRange("t", 0, 100, 200),
        OffsetRange("t", 1, 0, 100),
    ]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"batch_share": "lag", "max_records_per_batch": 10},
            r"batch_share: must be one of 'even', 'backlog', got 'lag'",
        ),
        (
            {"batch_share": "backlog"},
            r"batch_share: 'backlog' shares max_records_per_batch, which is not set",
        ),
        ({"max_records_per_batch": True}, r"max_records_per_batch: must be a positive whole number"),
    ],
)
def test_bad_batch_share_is_named(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Limits(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_share"):
        plan_ranges({("t", 0): 0}, {("t", 0): 1}, max_total=1, share="lag")


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
