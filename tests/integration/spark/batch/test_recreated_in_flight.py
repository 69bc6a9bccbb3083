"""A topic deleted and re-created while a batch is in flight (issue 20, item 1), against real
PostgreSQL, Kafka and Spark.

The window is made deterministic: the user's own code (a PartitionWriter's aggregate in the Spark
task, a BatchWriter's or a stream's compute_df on the driver) re-creates the topic and fills the
new one BEFORE it reads the batch's records, so the reader hands it the NEW topic's records at the
offsets planned from the OLD one.

Before the fix the claim checked ``off = start`` and the generation only: the new topic's records
0..99 were committed under the old topic's range [0, 100). With on_data_loss="skip" the next plan
then moved the offset back to the new log start and applied them again (250 where Kafka holds
150); with "fail", DataLoss said the stored offset 100 "was of the old topic", which was false.
Now the task checks the topic id after reading and before claiming: TopicChanged, nothing
committed, planned again - and that plan tells the truth.
"""

from __future__ import annotations

import collections
import functools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.integration.spark.counting import Counting, counts_table_of, key_counts, key_of
from tests.integration.spark.stream.test_streaming import _wait_for
from tests.kafka_topics import recreate_topic
from txn_offsets import BatchWriter, DataLoss, PartitionWriter, StartPolicy, TopicChanged
from txn_offsets.kafka.metadata import describe_topics
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.upserts import upsert_add

OLD, NEW = 100, 150  # records of the first and of the re-created topic (one partition)


@dataclass(frozen=True)
class RecreateOnce:
    """Deletes `topic`, creates it again and writes NEW records to it - once per test (a flag file
    made with O_EXCL: Spark may run the user's code again, in another Python worker)."""

    bootstrap: str
    topic: str
    flag: str

    def __call__(self) -> None:
        try:
            os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        recreate_topic(self.bootstrap, self.topic, 1)
        consumer_ends = AdminClient({"bootstrap.servers": self.bootstrap})
        # the broker serves the new, empty partition before anything is written: a producer that
        # wrote while the broker still served the deleted log appended to the OLD incarnation (seen
        # under load: the job then rightly committed 250 offsets of it, and the new topic stayed empty)
        deadline = time.monotonic() + 60
        while _end(consumer_ends, self.topic) != 0:
            assert time.monotonic() < deadline, f"{self.topic} was never served empty after its re-creation"
            time.sleep(0.1)
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})
        for i in range(NEW):
            producer.produce(self.topic, key=f"new-{i % 13}".encode(), value=b"1", partition=0)
        assert producer.flush(60) == 0
        deadline = time.monotonic() + 60
        while _end(consumer_ends, self.topic) < NEW:  # visible to the job's next plan
            assert time.monotonic() < deadline, f"{self.topic} never reached {NEW} records"
            time.sleep(0.1)


def _end(admin: AdminClient, topic: str) -> int:
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    try:
        futures = admin.list_offsets(
            {TopicPartition(topic, 0): OffsetSpec.latest()},  # type: ignore[no-untyped-call]
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=10,
        )
        return int(next(iter(futures.values())).result(timeout=15).offset)
    except KafkaException:
        return -1


def count_after(recreate: RecreateOnce, keys: Iterator[str]) -> collections.Counter[str]:
    """aggregate (in the Spark task): the topic is re-created before the first record is read."""
    recreate()
    return collections.Counter(keys)


def write_counter(
    table: str, conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]
) -> None:
    upsert_add(
        conn, counts_table_of(table), [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"]
    )


def counts_after(recreate: RecreateOnce, records: Any) -> list[tuple[str, int]]:
    """compute_df (on the driver): re-create the topic, then run the Spark job that reads the batch."""
    recreate()
    return key_counts(records)


def write_rows(
    table: str, conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]
) -> None:
    upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])


def _new_counts() -> dict[str, int]:
    return dict(collections.Counter(f"new-{i % 13}" for i in range(NEW)))


@pytest.mark.parametrize(
    ("writer_kind", "execution", "policy"),
    [
        ("partition", "rdd", "skip"),
        ("partition", "dataframe", "fail"),
        ("batch", "rdd", "fail"),
        ("batch", "dataframe", "skip"),
    ],
)
def test_a_topic_recreated_between_plan_and_read_is_never_committed_under_the_old_id(
    counting: Counting, tmp_path: Path, writer_kind: str, execution: str, policy: str
) -> None:
    topic, _ = counting.topic(1, OLD)
    old_id = describe_topics(counting.kafka, [topic])[topic].topic_id
    recreate = RecreateOnce(counting.kafka.bootstrap_servers, topic, str(tmp_path / "recreated"))
    writer: Any
    if writer_kind == "partition":
        writer = PartitionWriter(
            write=functools.partial(write_counter, counting.table),
            decode=key_of,
            aggregate=functools.partial(count_after, recreate),
        )
    else:
        writer = BatchWriter(
            compute_df=functools.partial(counts_after, recreate),
            write=functools.partial(write_rows, counting.table),
        )
    options: dict[str, Any] = {
        "on_data_loss": policy,
        "execution": execution,
        "retries": 2,
        "retry_backoff_s": 0.1,
    }
    if policy == "fail":
        with pytest.raises(DataLoss) as info:
            counting.run(topic, writer=writer, **options)
        new_id = describe_topics(counting.kafka, [topic])[topic].topic_id
        # the truth: the stored offset 0 is of the old topic, nothing of either topic was applied
        assert info.value.kind == "recreated"
        assert (info.value.stored, info.value.log_start) == (0, 0)
        assert (info.value.stored_topic_id, info.value.topic_id) == (old_id, new_id) and old_id != new_id
        assert f"committed for Kafka topic id {old_id}" in str(info.value)
        assert counting.totals() == {}
        assert counting.offsets() == {(topic, 0): 0}
    else:
        counting.run(topic, writer=writer, **options)
        # the old topic's records are gone (deleted before anything read them); the new topic's
        # are applied exactly once: 150 where Kafka holds 150, never 250
        assert counting.totals() == _new_counts()
        assert counting.offsets() == {(topic, 0): NEW}
    assert os.path.exists(recreate.flag)  # the window was really hit


def stream_counts(recreate: RecreateOnce, batch: Any) -> list[tuple[str, int]]:
    return counts_after(recreate, batch)


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_stream_batch_whose_topic_was_recreated_commits_nothing(
    spark: Any, counting: Counting, tmp_path: Path, policy: str
) -> None:
    topic, _ = counting.topic(1, OLD)
    recreate = RecreateOnce(counting.kafka.bootstrap_servers, topic, str(tmp_path / "recreated"))
    with open_stream(
        spark,
        job=counting.job,
        kafka=counting.kafka,
        database=counting.db,
        topics=[topic],
        start=StartPolicy.earliest(),
        on_data_loss=policy,
        checkpoint_root=str(tmp_path / "checkpoints"),
    ) as stream:
        query = stream.start(
            compute_df=functools.partial(stream_counts, recreate),
            write=functools.partial(write_rows, counting.table),
            interval_s=0.2,
        )
        if policy == "fail":
            # the batch read the new topic: let go without a commit; the next plan tells the truth
            with pytest.raises(Exception, match=r"DataLoss|deleted and re-created"):
                query.awaitTermination(180)
            assert counting.totals() == {}
            assert counting.offsets() == {(topic, 0): 0}
        else:
            # the same query goes on: an audited skip to the new log start, the new topic once
            _wait_for(lambda: counting.offsets() == {(topic, 0): NEW})
            assert counting.totals() == _new_counts()
            assert query.isActive and query.exception() is None
            query.stop()
    assert os.path.exists(recreate.flag)


def test_topic_changed_names_both_ids_and_says_nothing_was_committed() -> None:
    err = TopicChanged("orders", "id-a", "id-b")
    assert "id-a" in str(err) and "id-b" in str(err) and "Nothing of it was committed" in str(err)
    gone = TopicChanged("orders", "id-a", None)
    assert "does not exist any more" in str(gone)
