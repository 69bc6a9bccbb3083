"""The body of a shared round's Spark task (txn_offsets.spark.rounds.RoundTask): every unit's reports
come back tagged with its own job, in unit order, and a unit that raises fails its own job only -
the units after it, of other jobs, still run."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.spark.rounds import RoundTask, UnitFailed


@dataclass(frozen=True)
class _Run:
    job: str


@dataclass(frozen=True)
class _Task:
    """Stands in for one job's PartitionTask: one report per range index, or an error."""

    name: str
    fails: bool

    @property
    def run(self) -> _Run:
        return _Run(self.name)

    def joinable(self, ranges: int) -> bool:
        return False  # each unit runs as its own task would (the joint commit: test_joint_commit)

    def __call__(self, index: int, assigned: Iterable[Any]) -> Iterator[tuple[str, int]]:
        for group in assigned:
            for i in group:
                if self.fails:
                    raise ValueError(f"job {self.name} cannot write range {i}")
                yield self.name, i


@given(
    fails=st.lists(st.booleans(), min_size=1, max_size=6),
    units=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 50), max_size=4)), max_size=12),
)
def test_units_report_to_their_own_job(fails: list[bool], units: list[tuple[int, list[int]]]) -> None:
    tasks = tuple(_Task(f"j{i}", f) for i, f in enumerate(fails))
    units = [(job % len(tasks), group) for job, group in units]
    out = list(RoundTask(tasks)(0, [units]))  # type: ignore[arg-type]  # duck-typed PartitionTasks
    expected: list[tuple[int, Any]] = []
    for job, group in units:
        if fails[job] and group:
            expected.append((job, "failed"))
        else:
            expected.extend((job, (f"j{job}", i)) for i in group)
    seen = [(job, "failed" if isinstance(item, UnitFailed) else item) for job, item in out]
    assert seen == expected


def test_the_failure_names_the_exception_not_the_traceback() -> None:
    tasks = (_Task("good", False), _Task("bad", True))
    out = list(RoundTask(tasks)(3, [[(1, (7,)), (0, (1, 2))]]))  # type: ignore[arg-type]
    assert out[1:] == [(0, ("good", 1)), (0, ("good", 2))]
    job, failure = out[0]
    assert job == 1 and isinstance(failure, UnitFailed)
    assert str(failure) == "ValueError: job bad cannot write range 7"
