"""The lab scenarios' pure logic (in make test: no lab needed): the transaction coordinator's
partition of a transactional id (Kafka's ``Utils.abs(id.hashCode) % n``), the broker leading a
topic, and the recovery time from the lineage's commit times."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.scenarios.lab import coordinator_partition, every_partition_s, leading_broker, recovery_s

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("tid", "java_hash"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("\N{GRINNING FACE}", 1772899),
        ("pageviews-0", 1918151458),
        ("lab-x", 102725688),
        ("pageviews-lab-00c0ffee1234", -1730061859),
    ],
)
def test_coordinator_partition_is_javas_hash_code_modulo(tid: str, java_hash: int) -> None:
    assert coordinator_partition(tid, 8) == abs(java_hash) % 8
    assert coordinator_partition(tid, 50) == abs(java_hash) % 50


def test_the_hash_code_integer_min_value_maps_to_partition_zero() -> None:
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE: Utils.abs gives 0, not a negative number
    assert coordinator_partition("polygenelubricants", 7) == 0


@given(st.text(max_size=40), st.integers(min_value=1, max_value=200))
def test_coordinator_partition_is_in_range(tid: str, n: int) -> None:
    assert 0 <= coordinator_partition(tid, n) < n


def test_leading_broker_is_the_most_common_leader_lowest_on_ties() -> None:
    assert leading_broker({0: 2, 1: 2, 2: 3}) == 2
    assert leading_broker({0: 3, 1: 1}) == 1
    assert leading_broker({0: 3}) == 3


def test_recovery_is_the_first_commit_after_the_fault() -> None:
    base = dt.datetime(2026, 11, 28, 16, 0, tzinfo=dt.UTC)
    fault = base.timestamp() + 10
    commits = [base + dt.timedelta(seconds=s) for s in (3, 9.5, 17.25, 12.5, 40)]
    assert recovery_s(fault, commits) == pytest.approx(2.5)
    assert recovery_s(fault, commits[:2]) is None
    assert recovery_s(fault, []) is None


def test_every_partition_is_the_latest_of_the_partitions_first_commits_after_the_fault() -> None:
    base = dt.datetime(2026, 11, 28, 16, 0, tzinfo=dt.UTC)
    fault = base.timestamp() + 10
    rows = [
        (p, base + dt.timedelta(seconds=s)) for p, s in ((0, 5), (0, 11), (0, 30), (1, 25), (1, 14), (2, 9))
    ]
    assert every_partition_s(fault, rows) == pytest.approx(4.0)  # partition 1 at 14 s; 2 never after
    assert every_partition_s(fault, rows[:1]) is None


def test_every_lab_scenario_is_registered_with_its_share() -> None:
    """``python -m chaos --lab`` (and make chaos's lab part) runs L1-L8, 10,000 records each by default."""
    from chaos.scenarios import SCENARIOS
    from chaos.suite import LAB, LAB_MESSAGES, budget

    assert LAB == ("L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8")
    assert set(LAB) <= set(SCENARIOS)
    assert budget(LAB, LAB_MESSAGES) == dict.fromkeys(LAB, 10_000)
