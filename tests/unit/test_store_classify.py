"""Property tests of the protocol's decisions (pure functions, no database)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from txn_offsets import Fenced, OffsetConflict, OffsetsRolledBack, TopicChanged, UnknownJob
from txn_offsets.commit.classify import ClaimResult, Settled, classify_claim, classify_reread
from txn_offsets.ranges import OffsetRange

offsets = st.integers(min_value=0, max_value=2**40)
generations = st.integers(min_value=1, max_value=10**6)


@st.composite
def ranges(draw: st.DrawFn, partition: int = 0) -> OffsetRange:
    start = draw(offsets)
    return OffsetRange("t", partition, start, start + draw(st.integers(min_value=0, max_value=10**6)))


@given(rng=ranges(), found=st.none() | offsets, found_gen=st.none() | generations, my_gen=generations)
def test_classify_claim_follows_the_protocol(
    rng: OffsetRange, found: int | None, found_gen: int | None, my_gen: int
) -> None:
    if found_gen is None:
        with pytest.raises(UnknownJob):
            classify_claim("j", rng, found, found_gen, my_gen)
    elif found_gen != my_gen:
        with pytest.raises(Fenced) as fenced:
            classify_claim("j", rng, found, found_gen, my_gen)
        assert (fenced.value.generation, fenced.value.current) == (my_gen, found_gen)
    elif found == rng.until:
        # the only success of a claim that moved no row: this exact range is already committed
        assert classify_claim("j", rng, found, found_gen, my_gen) is ClaimResult.ALREADY_COMMITTED
    elif found is not None and found < rng.start:
        # behind the start at our own generation: the database lost commits (failover): plan again
        with pytest.raises(OffsetsRolledBack) as behind:
            classify_claim("j", rng, found, found_gen, my_gen)
        assert (behind.value.expected, behind.value.found) == (rng.start, found)
    else:
        with pytest.raises(OffsetConflict) as conflict:
            classify_claim("j", rng, found, found_gen, my_gen)
        err = conflict.value
        assert (err.job, err.topic, err.partition, err.expected, err.found) == ("j", "t", 0, rng.start, found)


@given(rng=ranges(), my_gen=generations, newer=st.integers(min_value=1, max_value=100))
def test_fencing_wins_over_already_committed(rng: OffsetRange, my_gen: int, newer: int) -> None:
    with pytest.raises(Fenced):
        classify_claim("j", rng, rng.until, my_gen + newer, my_gen)


@given(rng=ranges(), delta=st.integers(min_value=1, max_value=10**6), gen=generations)
def test_any_other_offset_is_a_conflict(rng: OffsetRange, delta: int, gen: int) -> None:
    for found in (rng.until + delta, max(0, rng.start - delta)):
        assume(found != rng.until)
        # behind the start: the database lost commits under the run (OffsetsRolledBack, transient)
        with pytest.raises(OffsetsRolledBack if found < rng.start else OffsetConflict):
            classify_claim("j", rng, found, gen, gen)


@st.composite
def batches(draw: st.DrawFn) -> list[OffsetRange]:
    n = draw(st.integers(min_value=1, max_value=5))
    return [draw(ranges(partition=p)) for p in range(n)]


@given(
    batch=batches(),
    picks=st.lists(st.sampled_from(["start", "until", "other", "none"]), min_size=5, max_size=5),
    found_gen=st.none() | generations,
    my_gen=generations,
)
def test_classify_reread_is_total_and_consistent(
    batch: list[OffsetRange], picks: list[str], found_gen: int | None, my_gen: int
) -> None:
    def value(r: OffsetRange, pick: str) -> int | None:
        return {"start": r.start, "until": r.until, "other": r.until + 1, "none": None}[pick]

    found = {r.key: value(r, pick) for r, pick in zip(batch, picks, strict=False)}

    def call() -> Settled:
        return classify_reread("j", batch, found, found_gen, my_gen)

    if all(found[r.key] == r.until for r in batch):
        # a committed batch stays committed, whichever generation now holds the job
        assert call() is Settled.AT_UNTIL
    elif found_gen is None:
        with pytest.raises(UnknownJob):
            call()
    elif found_gen != my_gen:
        with pytest.raises(Fenced):
            call()
    elif all(found[r.key] == r.start for r in batch):
        assert call() is Settled.AT_START
    else:
        with pytest.raises(OffsetConflict) as conflict:
            call()
        bad = next(r for r in batch if r.partition == conflict.value.partition)
        # the reported range really is out of place, with its start as the expected offset
        assert conflict.value.expected == bad.start
        assert found[bad.key] != bad.start and conflict.value.found == found[bad.key]


@given(batch=batches(), my_gen=generations)
def test_reread_of_a_fully_committed_batch_is_at_until_even_after_fencing(
    batch: list[OffsetRange], my_gen: int
) -> None:
    found: dict[tuple[str, int], int | None] = {r.key: r.until for r in batch}
    assert classify_reread("j", batch, found, my_gen + 1, my_gen) is Settled.AT_UNTIL


def test_mixed_batch_reports_the_committed_range() -> None:
    batch = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 8)]
    with pytest.raises(OffsetConflict) as info:
        classify_reread("j", batch, {("t", 0): 0, ("t", 1): 8}, 3, 3)
    assert (info.value.partition, info.value.expected, info.value.found) == (1, 5, 8)


topic_ids = st.sampled_from(["id-a", "id-b"])


@given(rng=ranges(), planned=topic_ids, found_id=st.none() | topic_ids, found=offsets, gen=generations)
def test_a_row_of_another_topic_incarnation_is_never_this_range(
    rng: OffsetRange, planned: str, found_id: str | None, found: int, gen: int
) -> None:
    """A range planned from topic id A never counts as committed (nor conflicts) on a row of
    another incarnation: that is TopicChanged (plan again), even when the offsets happen to match."""
    planned_rng = OffsetRange(rng.topic, rng.partition, rng.start, rng.until, planned)
    if found_id == planned:
        if found == rng.until:
            assert classify_claim("j", planned_rng, found, gen, gen, found_topic_id=found_id) is (
                ClaimResult.ALREADY_COMMITTED
            )
        return
    with pytest.raises(TopicChanged) as changed:
        classify_claim("j", planned_rng, found, gen, gen, found_topic_id=found_id)
    assert (changed.value.planned_id, changed.value.current_id) == (planned, found_id)
    assert changed.value.in_store
    found_at = {planned_rng.key: planned_rng.until}
    with pytest.raises(TopicChanged):
        classify_reread("j", [planned_rng], found_at, gen, gen, found_topic_ids={planned_rng.key: found_id})
    # fencing still wins over everything
    with pytest.raises(Fenced):
        classify_claim("j", planned_rng, found, gen + 1, gen, found_topic_id=found_id)


@given(rng=ranges(), gen=generations)
def test_a_range_without_a_topic_id_is_classified_as_before(rng: OffsetRange, gen: int) -> None:
    assert (
        classify_claim("j", rng, rng.until, gen, gen, found_topic_id="any") is ClaimResult.ALREADY_COMMITTED
    )
    found = {rng.key: rng.until}
    assert classify_reread("j", [rng], found, gen, gen, found_topic_ids={rng.key: "any"}) is Settled.AT_UNTIL
