"""The runner's plan after a running batch's, worked out on a thread of the run while that batch's
Spark job runs (runner._PlanAhead): the same plan as plan_next made afterwards, taken only for the
plan it was started from."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from txn_offsets.plan.planner import Limits, Plan, plan_from, plan_next
from txn_offsets.spark import runner

LIMITS = Limits(max_records_per_batch=10)
IDS = {"t": "id-t"}


def _plan(start: int) -> Plan:
    stored = {("t", p): start for p in range(4)}
    marks = {("t", p): (0, start + 100) for p in range(4)}
    return plan_from(stored, marks, sorted(stored), LIMITS, IDS)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each plan_next of the runner ran on."""
    names: list[str] = []

    def recorded(committed: Plan, limits: Limits) -> Any:
        names.append(threading.current_thread().name)
        return plan_next(committed, limits)

    monkeypatch.setattr(runner, "plan_next", recorded)
    return names


def test_the_plan_started_from_the_committed_one_is_made_on_the_runs_thread(threads: list[str]) -> None:
    ahead = runner._PlanAhead()
    try:
        first = _plan(0)
        ahead.start(first, LIMITS)
        got = ahead.after(first, LIMITS)
    finally:
        ahead.close()
    expected = plan_next(first, LIMITS)
    assert got is not None and expected is not None
    assert (got, got.stored) == (expected, expected.stored)
    assert threads == ["txn-offsets-plan-next_0"]


def test_another_plan_is_planned_where_it_is_asked(threads: list[str]) -> None:
    ahead = runner._PlanAhead()
    try:
        first, other = _plan(0), _plan(50)
        ahead.start(first, LIMITS)
        got = ahead.after(other, LIMITS)  # e.g. the batch failed and was planned afresh
        again = ahead.after(first, LIMITS)  # what was started is taken once at most
    finally:
        ahead.close()
    assert got == plan_next(other, LIMITS)
    assert again == plan_next(first, LIMITS)
    assert threads[0] == "txn-offsets-plan-next_0"
    assert threads[1:] == [threading.current_thread().name] * 2


def test_nothing_started_plans_where_it_is_asked(threads: list[str]) -> None:
    ahead = runner._PlanAhead()
    first = _plan(0)
    assert ahead.after(first, LIMITS) == plan_next(first, LIMITS)
    ahead.close()
    assert threads == [threading.current_thread().name]
