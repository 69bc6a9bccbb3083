"""A counting job end to end on local Spark: per-key totals equal the oracle, offsets reach the end."""

from __future__ import annotations

import pytest

from tests.integration.spark.counting import Counting
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.summary import BatchReport


def test_counting_job_100k_over_8_partitions(counting: Counting) -> None:
    topic, expected = counting.topic(8, 100_000)
    summary = counting.run(topic, limits=Limits(max_records_per_partition=5_000))
    assert counting.totals() == dict(expected)
    assert summary.records == 100_000
    assert summary.batches >= 3  # 12,500 per partition in slices of 5,000
    assert counting.offsets() == counting.ends(topic, 8)
    # a restart finds nothing to do and changes nothing
    again = counting.run(topic, start=None)
    assert (again.batches, again.records) == (0, 0)
    assert again.generation == summary.generation + 1
    assert counting.totals() == dict(expected)


def test_topic_pattern_reads_every_matching_topic(counting: Counting) -> None:
    prefix = f"pat{counting.job[-6:]}"
    first, expected = counting.topic(2, 1_000, prefix=prefix)
    second, more = counting.topic(3, 1_500, prefix=prefix)
    counting.topic(1, 500)
    summary = counting.run(topic_pattern=rf"{prefix}-[0-9a-f]+")
    assert summary.records == 2_500
    assert counting.totals() == dict(expected + more)
    assert {topic for topic, _ in counting.offsets()} == {first, second}


@pytest.mark.parametrize(("share", "ranges_per_batch"), [("backlog", [3, 3, 3, 3]), ("even", [3, 1, 1, 1])])
def test_a_batch_cap_shared_by_backlog_drains_every_partition_together(
    counting: Counting, share: str, ranges_per_batch: list[int]
) -> None:
    # a skewed topic: partition 0 holds 6,667 records, partitions 1 and 2 about 667 each
    topic, _ = counting.topic(3)
    expected = counting.produce(topic, 6_000, 1)
    expected += counting.produce(topic, 2_000, 3, start=6_000)
    reports: list[BatchReport] = []
    summary = counting.run(
        topic, limits=Limits(max_records_per_batch=2_000, batch_share=share), on_batch=reports.append
    )
    assert counting.totals() == dict(expected)
    assert summary.records == 8_000
    assert [r.records for r in reports] == [2_000] * 4
    # by backlog every batch holds a share of every partition (no tail of partition 0 alone, one
    # busy task); evenly the small partitions are drained first
    assert [r.ranges for r in reports] == ranges_per_batch
    assert counting.offsets() == counting.ends(topic, 3)
