"""The stream source renews its run's lease once a trigger: a planned trigger through the plan's own
statement (``plan_batch(run=...)``: the lease renewed and the offsets read in one round trip, as
run_job's plans do), not with a transaction of its own before it (one PostgreSQL round trip a
micro-batch less on the query's critical path, issue 46); a trigger that plans no batch (a topic
missing, Kafka unavailable) still renews it, so a query waiting out its grace keeps its job."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from txn_offsets.errors import ServiceUnavailable
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream import source

START: dict[str, Any] = {"generation": 3, "next": {"t": {"0": 0}}, "batch": []}
RANGES = (OffsetRange("t", 0, 0, 5),)


def reader(
    monkeypatch: pytest.MonkeyPatch, plans: list[Any], calls: dict[str, list[Any]]
) -> source.StreamReader:
    run = SimpleNamespace(job="j", generation=3)
    config = SimpleNamespace(
        run=run,
        kafka=object(),
        spec=SimpleNamespace(
            limits=Limits(max_records_per_batch=100), on_data_loss="fail", selection=object(), start=None
        ),
        tasks=2,
    )

    def plan_batch(store: Any, kafka: Any, **kwargs: Any) -> Any:
        calls["plan_batch"].append(kwargs)
        got = plans.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got

    monkeypatch.setattr(source, "plan_batch", plan_batch)
    monkeypatch.setattr(source, "heartbeat", lambda store, run: calls["heartbeat"].append(run))
    monkeypatch.setattr(source, "save_plan", lambda store, run, reader, ranges: None)
    r = source.StreamReader(config)  # type: ignore[arg-type]
    r._store = SimpleNamespace()  # type: ignore[assignment]
    return r


def test_a_planned_trigger_renews_the_lease_in_its_plan_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list[Any]] = {"plan_batch": [], "heartbeat": []}
    r = reader(monkeypatch, [SimpleNamespace(ranges=RANGES)], calls)
    end = r.latestOffset(START, ReadMaxRows(100))
    assert end["batch"] == [["t", 0, 0, 5]]
    assert calls["heartbeat"] == []  # no transaction of its own
    (kwargs,) = calls["plan_batch"]
    assert kwargs["run"] is r.config.run  # the plan renews the lease (Fenced there if taken)
    assert kwargs["job"] == "j"


def test_a_trigger_without_a_batch_still_renews_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    down = ServiceUnavailable("Kafka", "kafka-1:9092", "t[0]: no leader")
    calls: dict[str, list[Any]] = {"plan_batch": [], "heartbeat": []}
    r = reader(monkeypatch, [down, down], calls)
    assert r.latestOffset(START, ReadMaxRows(100)) == START
    assert r.latestOffset(START, ReadMaxRows(100)) == START
    assert calls["heartbeat"] == [r.config.run, r.config.run]  # one renewal a trigger
