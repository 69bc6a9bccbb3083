"""A low-latency run fenced by a newer run where only the driver sees it (issue 41, item 3): during
its last epoch, after its tasks stopped (they never check again), or after its last epoch, before
the run's final mirror. Either way it ends with Fenced and publishes nothing more: no ``on_batch``,
no summary, no write to the consumer-group mirror under its old generation.

The fence is placed deterministically by wrapping two of the driver's steps (the epoch's Spark job
and the lease renewal, both in the test's own process); Spark, PostgreSQL and Kafka are real."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from tests.integration.spark.counting import Counting
from txn_offsets import BatchReport, Fenced, LowLatency
from txn_offsets.spark import loop
from txn_offsets.spark.batch import batch_deadline
from txn_offsets.spark.lowlatency import watch
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, heartbeat, start_run

# an entry no mirror writes (a mirror's metadata is "txn_offsets:v1:g=<generation>"): put in the
# group at the fence, it shows any later write to the group, whatever that write's offsets
MARK = "test:the-group-at-the-fence"
# run_test_job runs until caught up: the tasks stop at the planned ends, long before epoch_s
OPTIONS = LowLatency(epoch_s=20, commit_interval_ms=10, check_interval_ms=100)


def fenced_message(job: str) -> str:
    """Fenced's message for this test's first run (generation 1), fenced by the newer one."""
    return re.escape(
        f"run generation 1 of job {job!r} was fenced by a newer run of this job (generation 2, run "
    )


def mark_group(admin: AdminClient, group: str, topic: str, partitions: int) -> None:
    entries = [KafkaTP(topic, p, 0, metadata=MARK) for p in range(partitions)]
    done = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, entries)])
    result = done[group].result(30)
    assert all(tp.error is None for tp in result.topic_partitions), result.topic_partitions


def group_entries(admin: AdminClient, group: str) -> set[tuple[int, int, str]]:
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {(tp.partition, tp.offset, tp.metadata) for tp in listed.topic_partitions}


def one_epoch(counting: Counting, topic: str, group: str, published: list[BatchReport]) -> None:
    """The counting job's run of one epoch over `topic`, mirrored to `group`, its reports published
    to `published`."""
    counting.run(topic, max_batches=1, low_latency=OPTIONS, mirror_group=group, on_batch=published.append)


def test_a_fence_only_the_lease_renewal_sees_ends_the_run(
    counting: Counting, kafka_admin: AdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's only (so last) epoch: its tasks commit everything and stop caught up; then, before
    the epoch's Spark job has returned to the driver, a newer run starts. Only the driver's lease
    renewal sees it - the case the driver used to drop (publishing the epoch and flushing the
    mirror under generation 1)."""
    topic, expected = counting.topic(2, 400)
    group = f"{counting.job}-mirror"
    tasks_returned = threading.Event()  # the epoch's Spark job returned (its tasks saw no fence)
    fence_seen = threading.Event()  # the driver's renewal raised Fenced after the newer run started
    newer: list[Run] = []

    @contextlib.contextmanager
    def then_hold(spark: Any, group_id: str, timeout_s: float | None) -> Iterator[threading.Event]:
        with batch_deadline(spark, group_id, timeout_s) as fired:
            yield fired
        # the tasks' reports are in; the epoch stays running (this thread alive) until the driver's
        # renewal has met the newer run - bounded, so a driver that never renews fails the test
        tasks_returned.set()
        fence_seen.wait(30)

    def renew(store: Store, run: Run) -> None:
        # on the driver's watch thread, which is also the only one that mirrors during an epoch:
        # no mirror write is in flight while the group is marked and the newer run starts
        if tasks_returned.is_set() and not newer:
            mark_group(kafka_admin, group, topic, 2)
            newer.append(start_run(Store(counting.engine, counting.db), counting.job, force=True))
        try:
            heartbeat(store, run)
        except Fenced:
            if newer:
                fence_seen.set()
            raise

    monkeypatch.setattr(watch, "batch_deadline", then_hold)
    monkeypatch.setattr(watch, "heartbeat", renew)
    published: list[BatchReport] = []
    with pytest.raises(Fenced, match=fenced_message(counting.job)) as raised:
        one_epoch(counting, topic, group, published)
    assert fence_seen.is_set()
    assert (raised.value.job, raised.value.generation, raised.value.current) == (counting.job, 1, 2)
    assert [run.generation for run in newer] == [2]
    assert published == []  # the fenced epoch was not published
    assert group_entries(kafka_admin, group) == {(p, 0, MARK) for p in range(2)}  # nor mirrored
    # what the tasks committed before the fence stands, once
    assert counting.totals() == dict(expected)
    assert counting.offsets() == {(topic, p): 200 for p in range(2)}


def test_a_run_fenced_after_its_last_epoch_mirrors_nothing(
    counting: Counting, kafka_admin: AdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last epoch ends and is published; a newer run starts before the run's final mirror of
    the table's offsets, which must then send nothing and end the run with Fenced."""
    topic, expected = counting.topic(2, 400)
    group = f"{counting.job}-mirror"
    newer: list[Run] = []
    real_repeat = loop._repeat

    def then_fence(*args: Any, **kwargs: Any) -> None:
        real_repeat(*args, **kwargs)
        # after the last epoch, on the driver's thread: no mirror write is in flight
        mark_group(kafka_admin, group, topic, 2)
        newer.append(start_run(Store(counting.engine, counting.db), counting.job, force=True))

    monkeypatch.setattr(loop, "_repeat", then_fence)
    published: list[BatchReport] = []
    with pytest.raises(Fenced, match=fenced_message(counting.job)):
        one_epoch(counting, topic, group, published)
    assert [run.generation for run in newer] == [2]
    assert [report.records for report in published] == [400]  # committed and published before it
    assert group_entries(kafka_admin, group) == {(p, 0, MARK) for p in range(2)}
    assert counting.totals() == dict(expected)
    assert counting.offsets() == {(topic, p): 200 for p in range(2)}
