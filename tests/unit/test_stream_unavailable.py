"""The stream's planning while Kafka is unavailable (a broker died, its partitions' leaders moving: the
lab's chaos L6): no new batch for up to UNAVAILABLE_GRACE_S, as run_job retries, then the error.

Before, the first ServiceUnavailable of ``latestOffset`` failed the streaming query: one broker of
three killed ended a stream that run_job would have carried on.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from txn_offsets.errors import ServiceUnavailable
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.stream import source

START: dict[str, Any] = {"generation": 1, "next": {"t": {"0": 5}}, "batch": []}


def reader(monkeypatch: pytest.MonkeyPatch, plans: list[Any]) -> source.StreamReader:
    """A reader whose plans are `plans` in turn (an exception is raised), with no store."""
    config = SimpleNamespace(
        run=SimpleNamespace(job="j", generation=1), spec=SimpleNamespace(limits=Limits(), on_data_loss="fail")
    )
    monkeypatch.setattr(source, "heartbeat", lambda store, run: None)
    r = source.StreamReader(config)  # type: ignore[arg-type]
    r._store = SimpleNamespace()  # type: ignore[assignment]  # heartbeat is the only user here

    def plan(_limits: Limits) -> Any:
        got = plans.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got

    monkeypatch.setattr(r, "_plan", plan)
    return r


def test_no_batch_while_kafka_is_unavailable_then_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    down = ServiceUnavailable("Kafka", "kafka-1:9092", "t[0]: no offset in the answer")
    clock = [100.0]
    monkeypatch.setattr("txn_offsets.spark.stream.source.time.monotonic", lambda: clock[0])
    r = reader(monkeypatch, [down, down, SimpleNamespace(ranges=()), down, down])
    limit = ReadAllAvailable()
    assert r.latestOffset(START, limit) == START  # no new batch: the query stays up
    clock[0] += source.UNAVAILABLE_GRACE_S - 1
    assert r.latestOffset(START, limit) == START
    clock[0] += 5
    assert r.latestOffset(START, limit) == START  # planned again: nothing new, the wait is over
    clock[0] += 5
    assert r.latestOffset(START, limit) == START  # a new wait starts at this failure
    clock[0] += source.UNAVAILABLE_GRACE_S + 1
    with pytest.raises(ServiceUnavailable, match="no offset in the answer"):
        r.latestOffset(START, limit)
