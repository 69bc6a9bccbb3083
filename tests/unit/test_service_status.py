"""The job status rules on a clock of our own: the trend and hold windows, Kafka down, bad
thresholds, and TXN_OFFSETS_SERVE_GROUPS."""

from __future__ import annotations

import pytest

from txn_offsets.admin.lag import partition_lags
from txn_offsets.errors import ConfigError
from txn_offsets.service.kafka_view import KafkaFacts
from txn_offsets.service.server import groups_from_env
from txn_offsets.service.snapshot import JobView, Snapshot, StoredRow
from txn_offsets.service.status import JobStatuses, StatusRules
from txn_offsets.store.stats import JobStats

RULES = StatusRules(stall_after_s=30.0, trend_window_s=60.0, fenced_hold_s=100.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snap(
    offset: int, end: int, *, live: bool = True, age: float = 1.0, fenced: int = 0, kafka: bool = True
) -> Snapshot:
    stats = JobStats("j", 1, 1.0, (1,) + (0,) * 12, {"committed": 1, "fenced": fenced})
    lags = partition_lags({("t", 0): offset}, {"t": (0,)}, {("t", 0): (0, end)}, {}) if kafka else ()
    view = JobView("j", 1, "r" if live else None, live, 1.0, {("t", 0): StoredRow(offset, age)}, lags, stats)
    facts = KafkaFacts(frozenset({"t"}), error=None if kafka else "Kafka down", fetched_at=1.0)
    return Snapshot((view,), None, facts)


def test_lagging_needs_lag_growing_over_the_window_and_forgets_it() -> None:
    clock = Clock()
    statuses = JobStatuses(RULES, clock)
    assert statuses.observe(snap(0, 10)) == {"j": "OK"}  # one sample
    clock.now += 10
    assert statuses.observe(snap(2, 15)) == {"j": "LAGGING"}  # 10 -> 13
    clock.now += 10
    assert statuses.observe(snap(9, 21)) == {"j": "OK"}  # 12 < 13: it catches up
    clock.now += 10
    assert statuses.observe(snap(9, 30)) == {"j": "OK"}  # 10, 13, 12, 21: not growing throughout
    clock.now += 61  # the window forgets the dip
    assert statuses.observe(snap(9, 31)) == {"j": "OK"}  # one sample again
    clock.now += 1
    assert statuses.observe(snap(9, 32)) == {"j": "LAGGING"}


def test_fenced_is_held_then_released_and_beats_stopped() -> None:
    clock = Clock()
    statuses = JobStatuses(RULES, clock)
    assert statuses.observe(snap(5, 5, fenced=2)) == {"j": "OK"}  # a count seen first is history
    clock.now += 5
    assert statuses.observe(snap(5, 5, fenced=3, live=False)) == {"j": "FENCED"}
    clock.now += 99
    assert statuses.observe(snap(5, 5, fenced=3, live=False)) == {"j": "FENCED"}
    clock.now += 2
    assert statuses.observe(snap(5, 5, fenced=3, live=False)) == {"j": "STOPPED"}


def test_out_of_log_stalled_and_kafka_down() -> None:
    statuses = JobStatuses(RULES, Clock())
    assert statuses.observe(snap(50, 10, live=False)) == {"j": "OUT_OF_LOG"}
    assert statuses.observe(snap(3, 10, age=31.0)) == {"j": "STALLED"}
    assert statuses.observe(snap(10, 10, age=3600.0)) == {"j": "OK"}  # caught up: nothing to stall on
    assert statuses.observe(snap(3, 10, kafka=False)) == {}  # undecidable without Kafka's answer
    assert statuses.observe(snap(3, 10, kafka=False, live=False)) == {"j": "STOPPED"}
    assert statuses.observe(Snapshot(database_error="down")) == {}


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_rules_refuse_bad_thresholds(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"stall_after_s.*give a number of seconds > 0"):
        StatusRules(stall_after_s=bad)


def test_groups_from_env() -> None:
    env = "TXN_OFFSETS_SERVE_GROUPS"
    assert groups_from_env({}) == {}
    assert groups_from_env({env: " a=group-a , b = g-b,"}) == {"a": "group-a", "b": "g-b"}
    for value, message in (
        ("a", "give job=group pairs"),
        ("a=", "give job=group pairs"),
        ("a=g,b=g", "group 'g' is given to more than one job"),
        ("a=g\x01", "printable consumer group id"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            groups_from_env({env: value})
        assert str(err.value).startswith(env)


def test_serve_flags_default_to_the_rules_defaults() -> None:
    from txn_offsets.cli.main import build_parser

    args = build_parser().parse_args(["serve"])
    assert StatusRules(args.stall_after_s, args.trend_window_s, args.fenced_hold_s) == StatusRules()
    args = build_parser().parse_args(["serve", "--stall-after-s", "1.5", "--fenced-hold-s", "60"])
    assert (args.stall_after_s, args.trend_window_s, args.fenced_hold_s) == (1.5, 600.0, 60.0)
