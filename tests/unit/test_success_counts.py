"""A batch's statistics from its task reports (pure): ranges per success outcome, every other
outcome left out, keyed by the outcome's value (and so by the outcome itself)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.commit import Outcome
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import TaskReport, success_counts


@given(st.lists(st.sampled_from(list(Outcome)), max_size=200))
def test_success_outcomes_counted_and_only_those(outcomes: list[Outcome]) -> None:
    reports = [TaskReport(OffsetRange("t", i, 0, 1), o, 1) for i, o in enumerate(outcomes)]
    counts = success_counts(reports)
    assert counts == {
        "committed": outcomes.count(Outcome.COMMITTED),
        "already_committed": outcomes.count(Outcome.ALREADY_COMMITTED),
    }
    assert counts[Outcome.COMMITTED] == counts["committed"]
    assert sum(counts.values()) == sum(o.success for o in outcomes)
