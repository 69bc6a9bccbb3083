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


def _linear(spans: list[int], tasks: int) -> tuple[tuple[int, ...], ...]:
    """The placement rule spelled out: largest span first (ties: lower index) onto the lightest
    group (ties: lower group)."""
    load = [0] * tasks
    groups: list[list[int]] = [[] for _ in range(tasks)]
    for i in sorted(range(len(spans)), key=lambda i: (-spans[i], i)):
        g = min(range(tasks), key=lambda g: (load[g], g))
        groups[g].append(i)
        load[g] += spans[i]
    return tuple(tuple(sorted(g)) for g in groups if g)


@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=300), st.integers(1, 9))
def test_the_rule_exactly_ties_included(spans: list[int], tasks: int) -> None:
    # small spans: many ties, whose order decides which group a range lands in
    assert assign_ranges(spans, tasks) == _linear(spans, tasks)
