"""benchmarks.profile_batch patches the functions the tasks call, by the names they look them up by."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

import pytest

from benchmarks import profile_batch
from txn_offsets.kafka import metadata
from txn_offsets.spark import tasks


def test_patch_finds_every_function_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    for module, name in (
        (metadata, "describe_topics"),
        (metadata, "watermarks"),
        (tasks, "commit_reporting"),
        (tasks, "read_in_order"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    read = vars(tasks)["read_in_order"]  # the name the tasks look it up by
    profile_batch._patch()  # an AttributeError when a task no longer looks a name up
    assert vars(tasks)["read_in_order"].__wrapped__ is read


def test_timed_steps_yields_every_item_and_counts_only_their_making(monkeypatch: pytest.MonkeyPatch) -> None:
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    monkeypatch.setattr(profile_batch, "_spent", spent)
    clock = iter([0.0, 1.0, 10.0, 12.0, 20.0, 20.5])  # per item: before next(), after it
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))

    def two() -> Iterator[str]:
        yield from ("a", "b")

    got = list(profile_batch._timed_steps("read", two)())
    assert got == ["a", "b"]
    assert spent["read"] == pytest.approx(1.0 + 2.0 + 0.5)
