"""A classic session's DataFrame path runs one DataFrame for every batch of a run (issue 46): the
batch's ranges, groups and number reach the Spark tasks in a local property of the driver's thread.
What a task rebuilds from it is the driver's task for that batch, range for range; a property that
is missing or meant for another DataFrame runs nothing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.frames import batch_of, batch_value
from txn_offsets.spark.tasks import PartitionTask
from txn_offsets.store.runs import Run


def _prepare(records: Any) -> int:
    return 0


def _write(conn: Any, items: Any) -> None:
    return None


TEMPLATE: PartitionTask[Any] = PartitionTask(
    database=DatabaseSettings("postgresql://job:s3cret@db.example/app", schema="app"),
    kafka=KafkaSettings("broker:9092"),
    run=Run("job", 3, "run-1"),
    ranges=(),
    prepare=_prepare,
    write=_write,
)


@st.composite
def offset_ranges(draw: st.DrawFn) -> OffsetRange:
    start = draw(st.integers(0, 2**63 - 2))
    until = draw(st.integers(start, 2**63 - 1))
    topic = draw(st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12))
    topic_id = draw(st.none() | st.text(min_size=1, max_size=22))
    return OffsetRange(topic, draw(st.integers(0, 100_000)), start, until, topic_id)


@given(
    ranges=st.lists(offset_ranges(), min_size=1, max_size=40),
    number=st.none() | st.integers(0, 2**40),
    tasks=st.integers(1, 4),
)
def test_a_task_rebuilds_the_drivers_batch(ranges: list[OffsetRange], number: int | None, tasks: int) -> None:
    groups = tuple(tuple(range(g, len(ranges), tasks)) for g in range(min(tasks, len(ranges))))
    driver = dataclasses.replace(TEMPLATE, ranges=tuple(ranges), batch=number)
    task, rebuilt = batch_of(batch_value("t1", groups, driver), "t1", TEMPLATE)
    assert rebuilt == groups
    assert task.batch == number and task.run == TEMPLATE.run and task.database == TEMPLATE.database
    assert [(r.packed, r.key) for r in task.ranges] == [(r.packed, r.key) for r in ranges]
    assert task == driver  # every other field is the template's


def test_the_property_carries_no_setting() -> None:
    """Offsets, topics and partitions only: Spark keeps a job's local properties in its event log."""
    driver = dataclasses.replace(TEMPLATE, ranges=(OffsetRange("orders", 1, 5, 9),), batch=7)
    value = batch_value("t1", ((0,),), driver)
    assert json.loads(value) == ["t1", 7, [[0]], [["orders", 1, 5, 9, None]]]
    assert "s3cret" not in value and "db.example" not in value and "broker" not in value


@pytest.mark.parametrize("value", [None, "", '["t2",1,[[0]],[["orders",1,5,9,null]]]'])
def test_a_job_without_its_batch_runs_nothing(value: str | None) -> None:
    with pytest.raises(RuntimeError, match="carries no txn_offsets batch for its DataFrame"):
        batch_of(value, "t1", TEMPLATE)
