"""A task's reports on their way to the driver (txn_offsets.spark.reports, pure): rebuilt from the
driver's own ranges they are the reports the task made, in order; only the ones that do not fit the
plain shape (an error, a range other than the planned one) travel whole."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.commit import Outcome
from txn_offsets.errors.batch import OffsetConflict
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.reports import packed, unpacked
from txn_offsets.spark.tasks import TaskReport

RANGES = tuple(OffsetRange("t", p, 10 * p, 10 * p + 5, "id-1") for p in range(40))
INDEXES = {r.key: i for i, r in enumerate(RANGES)}


@st.composite
def task_reports(draw: st.DrawFn) -> list[TaskReport]:
    picked = draw(st.lists(st.integers(0, len(RANGES) - 1), unique=True, max_size=20))
    reports = []
    for i in picked:
        rng = RANGES[i]
        kind = draw(st.sampled_from(["plain", "plain", "error", "moved", "other id", "unplanned"]))
        if kind == "moved":  # a report of the partition with other offsets than planned
            rng = OffsetRange(rng.topic, rng.partition, rng.start, rng.until + 1, rng.topic_id)
        elif kind == "other id":  # equal as a range, of another topic incarnation
            rng = OffsetRange(rng.topic, rng.partition, rng.start, rng.until, "id-2")
        elif kind == "unplanned":
            rng = OffsetRange("other", rng.partition, 0, 3, None)
        outcome = draw(st.sampled_from(list(Outcome)))
        error = OffsetConflict("job", rng.topic, rng.partition, rng.start, 99) if kind == "error" else None
        reports.append(TaskReport(rng, outcome, draw(st.integers(-1, 10**9)), error))
    return reports


def _same(a: TaskReport, b: TaskReport) -> bool:
    return (  # errors compare by identity: one that crossed a pickle is another object
        (a.range, a.outcome, a.records) == (b.range, b.outcome, b.records)
        and a.range.topic_id == b.range.topic_id
        and (a.error is None) == (b.error is None)
        and str(a.error) == str(b.error)
    )


@given(st.lists(task_reports(), max_size=4))
def test_the_driver_rebuilds_every_report_in_order(tasks: list[list[TaskReport]]) -> None:
    wire = [pickle.loads(pickle.dumps(packed(RANGES, INDEXES, reports))) for reports in tasks]  # noqa: S301
    rebuilt = unpacked(RANGES, wire)
    made = [r for reports in tasks for r in reports]
    assert len(rebuilt) == len(made)
    assert all(_same(a, b) for a, b in zip(rebuilt, made, strict=True))
    assert all(type(r.outcome) is Outcome for r in rebuilt)


def test_plain_reports_travel_as_plain_values_only() -> None:
    reports = [TaskReport(r, Outcome.COMMITTED, 5) for r in RANGES[:3]] + [
        TaskReport(RANGES[7], Outcome.ALREADY_COMMITTED, 0)
    ]
    wire = packed(RANGES, INDEXES, reports)
    assert wire == ((0, 1, 2, 7), ("committed",) * 3 + ("already_committed",), (5, 5, 5, 0), ())
    rebuilt = unpacked(RANGES, [wire])
    assert rebuilt == reports
    assert all(a.range is b for a, b in zip(rebuilt, RANGES[:3], strict=False))  # the driver's own


def test_a_report_with_an_error_travels_whole() -> None:
    error = OffsetConflict("job", "t", 3, 30, 31)
    reports = [TaskReport(RANGES[2], Outcome.COMMITTED, 1), TaskReport(RANGES[3], Outcome.CONFLICT, 0, error)]
    wire = packed(RANGES, INDEXES, reports)
    assert wire[0] == (2, -1)
    assert [r.error for r in wire[3]] == [error]
    rebuilt = unpacked(RANGES, [pickle.loads(pickle.dumps(wire))])  # noqa: S301
    assert rebuilt[0] == reports[0]
    assert isinstance(rebuilt[1].error, OffsetConflict) and rebuilt[1].error.found == 31
