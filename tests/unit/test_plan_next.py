"""The batch after a committed one, planned from what its plan saw (planner.plan_next, pure): it is
exactly the plan a fresh plan would make from the stored offsets the claims left and the same ends,
taken only while that plan fills a whole batch; a chain of them reads every offset once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.plan.planner import Limits, Plan, plan_from, plan_next
from txn_offsets.ranges import TopicPartition

TOPIC_IDS = {"a": "id-a", "b": "id-b"}

Seen = tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, tuple[int, int]]]


@st.composite
def seen(draw: st.DrawFn) -> Seen:
    """Partitions, their stored offsets and their (log start, end), as a fresh plan sees them."""
    keys = st.tuples(st.sampled_from(("a", "b")), st.integers(0, 5))
    partitions = draw(st.lists(keys, min_size=1, max_size=8, unique=True))
    stored: dict[TopicPartition, int] = {}
    marks: dict[TopicPartition, tuple[int, int]] = {}
    for tp in partitions:
        stored[tp] = draw(st.integers(0, 100))
        marks[tp] = (0, stored[tp] + draw(st.integers(0, 400)))
    return partitions, stored, marks


limits = st.builds(
    Limits,
    max_records_per_partition=st.none() | st.integers(1, 200),
    max_records_per_batch=st.integers(1, 300),
    batch_share=st.sampled_from(("even", "backlog")),
)


def _after(plan: Plan) -> dict[TopicPartition, int]:
    return {**plan.stored, **{r.key: r.until for r in plan.ranges}}


@given(seen(), limits)
def test_the_next_plan_is_the_fresh_plan_of_the_same_ends_when_it_fills_the_batch(
    state: Seen, limit: Limits
) -> None:
    partitions, stored, marks = state
    committed = plan_from(stored, marks, partitions, limit, TOPIC_IDS)
    fresh = plan_from(_after(committed), marks, partitions, limit, TOPIC_IDS)
    following = plan_next(committed, limit)
    full = sum(r.span for r in fresh.ranges) == limit.max_records_per_batch
    if not full:
        assert following is None  # a fresh plan may find more to read: it is asked for
        return
    assert following is not None
    assert following.ranges == fresh.ranges
    assert [r.topic_id for r in following.ranges] == [TOPIC_IDS[r.topic] for r in following.ranges]
    assert following.stored == _after(committed)
    assert following.lag_after == fresh.lag_after
    for rng in following.ranges:  # each starts where the claims left its row, never past the end
        assert rng.start == _after(committed)[rng.key] and rng.until <= marks[rng.key][1]


@given(seen(), limits)
def test_a_chain_of_next_plans_reads_every_offset_once(state: Seen, limit: Limits) -> None:
    partitions, stored, marks = state
    plan: Plan | None = plan_from(stored, marks, partitions, limit, TOPIC_IDS)
    read: dict[TopicPartition, list[tuple[int, int]]] = {}
    last = plan
    while plan is not None and plan.ranges:
        for rng in plan.ranges:
            read.setdefault(rng.key, []).append((rng.start, rng.until))
        last, plan = plan, plan_next(plan, limit)
    assert last is not None
    reached = _after(last)
    for tp in partitions:
        spans = read.get(tp, [])
        cursor = stored[tp]
        for start, until in spans:  # contiguous: no offset skipped, none read twice
            assert start == cursor and until > start
            cursor = until
        assert cursor == reached[tp] <= marks[tp][1]


def test_no_next_plan_without_a_batch_cap() -> None:
    tp = ("a", 0)
    committed = plan_from({tp: 0}, {tp: (0, 10_000)}, [tp], Limits(max_records_per_partition=10), TOPIC_IDS)
    assert [(r.start, r.until) for r in committed.ranges] == [(0, 10)]
    assert plan_next(committed, Limits(max_records_per_partition=10)) is None
