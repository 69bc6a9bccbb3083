"""The stream source stores each planned batch once: ``partitions()`` of the batch ``latestOffset``
just stored does not store it again (one PostgreSQL transaction a micro-batch less on the query's
critical path, issue 46), while a batch this reader did not store (Spark replaying its checkpoint's
last batch after a restart) still is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream import source

START: dict[str, Any] = {"generation": 1, "next": {"t": {"0": 0, "1": 0}}, "batch": []}
RANGES = (OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 7))


def reader(monkeypatch: pytest.MonkeyPatch, saved: list[tuple[OffsetRange, ...]]) -> source.StreamReader:
    """A reader that plans RANGES, with no store: `saved` gets each batch save_plan stores."""
    config = SimpleNamespace(
        run=SimpleNamespace(job="j", generation=1),
        spec=SimpleNamespace(limits=Limits(max_records_per_batch=100), on_data_loss="fail"),
        tasks=2,
    )
    monkeypatch.setattr(source, "heartbeat", lambda store, run: None)
    monkeypatch.setattr(source, "save_plan", lambda store, run, reader, ranges: saved.append(tuple(ranges)))
    r = source.StreamReader(config)  # type: ignore[arg-type]
    r._store = SimpleNamespace()  # type: ignore[assignment]
    monkeypatch.setattr(r, "_plan", lambda _limits: SimpleNamespace(ranges=RANGES))
    return r


def test_a_planned_batch_is_stored_once(monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[tuple[OffsetRange, ...]] = []
    r = reader(monkeypatch, saved)
    end = r.latestOffset(START, ReadMaxRows(100))
    parts = r.partitions(START, end)
    assert saved == [RANGES]  # latestOffset's only
    assert sorted(rng for p in parts for rng in p.value) == sorted(RANGES)


def test_a_replayed_batch_is_stored_again(monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[tuple[OffsetRange, ...]] = []
    planned = reader(monkeypatch, saved).latestOffset(START, ReadMaxRows(100))
    saved.clear()
    replaying = reader(monkeypatch, saved)  # a restarted query: Spark replays the checkpoint's batch
    replaying.partitions(START, planned)
    assert saved == [RANGES]
    replaying.partitions(START, planned)  # the same batch asked again: stored already
    assert saved == [RANGES]
