"""Whether a plan has anything to move (plan.moves.unmoved, pure): the one-statement plan of a running
job is taken exactly when settle_offsets would seed, adopt and skip nothing, and then gives the
stored offsets as they are."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.plan.data_loss import lost
from txn_offsets.plan.moves import unmoved
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.offset_rows import StoredOffset

TOPICS = ("a", "b")
IDS = ("id-1", "id-2")


State = tuple[
    dict[TopicPartition, StoredOffset],  # the job's rows
    list[TopicPartition],  # the partitions of its topics now
    dict[TopicPartition, tuple[int, int]],  # their log start and end
    dict[str, str],  # each topic's id now
    bool,  # the job's first plan
]


@st.composite
def states(draw: st.DrawFn) -> State:
    partitions = draw(
        st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 3)), min_size=1, max_size=6, unique=True)
    )
    topic_ids = {t: draw(st.sampled_from(IDS)) for t in TOPICS}
    marks: dict[TopicPartition, tuple[int, int]] = {}
    rows: dict[TopicPartition, StoredOffset] = {}
    for tp in partitions:
        low = draw(st.integers(0, 50))
        marks[tp] = (low, low + draw(st.integers(0, 50)))
        if draw(st.integers(0, 9)) > 0:  # mostly a row; at times none (a partition to seed)
            off = draw(st.integers(0, 120))
            topic_id = draw(st.one_of(st.none(), st.sampled_from(IDS)))
            rows[tp] = StoredOffset(off, topic_id)
    if draw(st.booleans()):  # a row of a partition the plan does not cover: not the plan's concern
        rows[("c", 0)] = StoredOffset(draw(st.integers(0, 9)), None)
    return rows, partitions, marks, topic_ids, draw(st.booleans())


@given(states())
def test_unmoved_exactly_when_there_is_nothing_to_seed_adopt_or_skip(state: State) -> None:
    rows, partitions, marks, topic_ids, first_plan = state
    to_move = (
        first_plan
        or any(tp not in rows for tp in partitions)  # seed
        or any(rows[tp].topic_id is None for tp in partitions)  # adopt the topic id
        or any(lost(rows[tp], topic_ids[tp[0]], marks[tp]) is not None for tp in partitions)  # skip / fail
    )
    got = unmoved(rows, partitions, marks, topic_ids, first_plan=first_plan)
    if to_move:
        assert got is None
    else:
        assert got == {tp: rows[tp].off for tp in partitions}
