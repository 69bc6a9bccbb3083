"""Placing a batch's ranges on Spark tasks (pure): every range exactly once, at most `tasks` groups,
loads balanced to within one range."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.spark.batch import assign_ranges


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=200), st.integers(1, 64))
def test_every_range_once_and_balanced(spans: list[int], tasks: int) -> None:
    groups = assign_ranges(spans, tasks)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(spans)))
    assert 1 <= len(groups) <= tasks
    assert all(list(g) == sorted(g) for g in groups)
    loads = [sum(spans[i] for i in g) for g in groups]
    if len(groups) == tasks:  # LPT: the heaviest group exceeds the lightest by at most one range
        assert max(loads) - min(loads) <= max(spans)


def test_one_task_per_range_when_asked() -> None:
    assert sorted(assign_ranges([5, 1, 3], 3)) == [(0,), (1,), (2,)]
    assert assign_ranges([5, 1, 3], 2) == ((0,), (1, 2))
