"""The bench's run order at a point: every contender's fresh run first, then interleaved warm runs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench import schedule
from benchmarks.settings import FRESH, WARM

names = st.lists(st.sampled_from([f"c{i}" for i in range(8)]), min_size=1, max_size=8, unique=True)


@given(
    names.flatmap(
        lambda order: st.tuples(
            st.just(order), st.lists(st.integers(0, 5), min_size=len(order), max_size=len(order))
        )
    )
)
def test_each_contender_runs_fresh_once_then_its_warm_runs(case: tuple[list[str], list[int]]) -> None:
    order, counts = case
    wanted = dict(zip(order, counts, strict=True))
    runs = schedule(order, wanted)
    assert runs[: len(order)] == [(c, FRESH) for c in order]
    assert all(label == WARM for _, label in runs[len(order) :])
    for c in order:
        assert runs.count((c, WARM)) == wanted[c]


def test_warm_runs_interleave_and_no_contender_is_always_first_or_last() -> None:
    runs = schedule(["eo", "alo", "sss"], {"eo": 4, "alo": 4, "sss": 2})
    warm = [c for c, label in runs if label == WARM]
    assert warm == ["alo", "sss", "eo", "sss", "eo", "alo", "eo", "alo", "alo", "eo"]
    # of the two that run 4 times, each goes first in two rounds
    eo_alo = [c for c in warm if c != "sss"]
    assert [eo_alo[i] for i in range(0, 8, 2)] == ["alo", "eo", "eo", "alo"]
