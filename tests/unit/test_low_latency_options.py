"""LowLatency's settings are checked on construction, each error naming the setting."""

from __future__ import annotations

from typing import Any

import pytest

from txn_offsets import ConfigError, LowLatency


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"epoch_s": 0}, "epoch_s"),
        ({"epoch_s": True}, "epoch_s"),
        ({"commit_interval_ms": -1}, "commit_interval_ms"),
        ({"commit_max_records": 0}, "commit_max_records"),
        ({"commit_max_records": 2.5}, "commit_max_records"),
        ({"check_interval_ms": 0}, "check_interval_ms"),
        ({"epoch_s": 0.1, "check_interval_ms": 250}, "check_interval_ms"),
        ({"fetch_wait_ms": -1}, "fetch_wait_ms"),
        ({"tasks": 0}, "tasks"),
        ({"mirror_every_s": 0}, "mirror_every_s"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        LowLatency(**kwargs)


def test_defaults() -> None:
    options = LowLatency()
    assert (options.epoch_s, options.commit_interval_ms, options.commit_max_records) == (60.0, 10.0, 5000)
    assert options.tasks is None and options.fetch_wait_ms == 5
