"""A task body carries its batch's ranges to the workers as plain tuples (cloudpickle makes a
Python call per dataclass it pickles: 18 ms for 4,096 ranges, ~1 ms packed) and gets them back as
the same ranges, topic ids included, each checked again as it is rebuilt."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark import cloudpickle

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.ranges import OffsetRange, PackedRanges, packed_ranges
from txn_offsets.spark.tasks import PartitionTask, ReadOptions, ReadTask
from txn_offsets.store.runs import Run

RANGES = st.lists(
    st.builds(
        lambda topic, part, start, span, topic_id: OffsetRange(topic, part, start, start + span, topic_id),
        st.sampled_from(["pages", "t.1", "clicks-2"]),
        st.integers(0, 5000),
        st.integers(0, 2**40),
        st.integers(0, 10_000),
        st.one_of(st.none(), st.sampled_from(["AbCdEfGhIjKlMnOpQrStUv", "x-_y"])),
    ),
    max_size=40,
).map(tuple)


def _write(*_: object) -> None: ...


@given(RANGES)
def test_a_task_body_pickles_its_ranges_and_gets_them_back(ranges: tuple[OffsetRange, ...]) -> None:
    task = PartitionTask(
        DatabaseSettings("postgresql+psycopg://u@h/db"), KafkaSettings("k:1"), Run("j", 2, "r"), ranges,
        prepare=_write, write=_write, read=ReadOptions(max_tasks=3), batch=7,
    )  # fmt: skip
    back = pickle.loads(cloudpickle.dumps(task))  # noqa: S301 - bytes this test pickled
    assert back == task and [r.topic_id for r in back.ranges] == [r.topic_id for r in ranges]
    read = pickle.loads(cloudpickle.dumps(ReadTask(KafkaSettings("k:1"), ranges)))  # noqa: S301
    assert read.ranges == ranges and [r.topic_id for r in read.ranges] == [r.topic_id for r in ranges]
    assert isinstance(back.ranges, PackedRanges) and back.ranges == ranges == tuple(back.ranges)
    assert PackedRanges(packed_ranges(ranges)) == ranges and hash(back.ranges) == hash(ranges)
    assert back.ranges[1:3] == ranges[1:3] and list(reversed(back.ranges)) == list(reversed(ranges))


def test_a_packed_range_is_checked_again_when_it_is_built() -> None:
    packed = PackedRanges([("pages", 0, 10, 12, None), ("pages", 1, 10, 3, None)])
    assert packed[0] == OffsetRange("pages", 0, 10, 12) and packed[0] is packed[0]  # built once
    with pytest.raises(ConfigError, match="below the start"):
        packed[1]  # only the range looked up is built: a task builds its own group's


def test_a_task_builds_only_the_ranges_it_looks_up() -> None:
    ranges = tuple(OffsetRange("pages", p, 0, 5) for p in range(6))
    task = PartitionTask(
        DatabaseSettings("postgresql+psycopg://u@h/db"), KafkaSettings("k:1"), Run("j", 2, "r"), ranges,
        prepare=_write, write=_write,
    )  # fmt: skip
    back = pickle.loads(cloudpickle.dumps(task))  # noqa: S301 - bytes this test pickled
    assert [back.ranges[i] for i in (4, 1)] == [ranges[4], ranges[1]]
    assert [i for i, r in enumerate(back.ranges._built) if r is not None] == [1, 4]
