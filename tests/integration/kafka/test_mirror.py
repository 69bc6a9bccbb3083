"""The consumer-group mirror against a real broker: what it writes is what AdminClient and Kafka's own
`kafka-consumer-groups.sh --describe` (ConsumerGroupCommand from the Kafka jars) read back, a
broker that cannot be reached costs a bounded wait, a warning and a counter - never an exception,
and a fenced, failed or older run never moves the group backwards."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.helpers import produce_counts
from txn_offsets._java import find_java
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.devstack.kafka import KAFKA_VERSION, cache_dir, ensure_libs
from txn_offsets.errors import ConfigError, Fenced
from txn_offsets.kafka.mirror import GroupMirror, group_offsets
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.publish import BatchPublisher
from txn_offsets.spark.tasks import TaskReport
from txn_offsets.store import migrate
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import tables_for

Describe = Callable[[str], list[list[str]]]


@pytest.fixture(scope="session")
def describe_group(kafka_bootstrap: str) -> Describe:
    """`kafka-consumer-groups.sh --describe --group G` as Kafka ships it: ConsumerGroupCommand from
    kafka-tools (fetched once from Maven Central beside the stack's Kafka jars) on those jars."""
    libs = ensure_libs()
    tools = cache_dir() / f"kafka-tools-{KAFKA_VERSION}"
    jar = tools / f"kafka-tools-{KAFKA_VERSION}.jar"
    if not jar.exists():
        mvn = shutil.which("mvn")
        assert mvn, "Maven is needed once to fetch kafka-tools"
        subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                f"-Dmaven.repo.local={cache_dir() / 'm2'}",
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
                f"-Dartifact=org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
                f"-DoutputDirectory={tools}",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    java = find_java()

    def run(group: str) -> list[list[str]]:
        done = subprocess.run(
            [
                java,
                "-cp",
                f"{Path(libs) / '*'}:{jar}",
                "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                "--bootstrap-server",
                kafka_bootstrap,
                "--describe",
                "--group",
                group,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return [line.split() for line in done.stdout.splitlines() if line.strip()]

    return run


def _ready_topic(topic_factory: TopicFactory, bootstrap: str, partitions: int) -> str:
    """A fresh topic the broker already serves (a commit right after creating a topic can be
    rejected with UNKNOWN_TOPIC_OR_PART until the broker's metadata has it)."""
    topic = topic_factory(partitions=partitions)
    produce_counts(bootstrap, topic, dict.fromkeys(range(partitions), 1))
    return topic


def test_mirror_is_what_the_lag_tools_read(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory, describe_group: Describe
) -> None:
    topic = topic_factory(partitions=3)
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 4, 2: 6})
    group = f"job-{uuid.uuid4().hex[:8]}"
    mirror = GroupMirror(KafkaSettings(kafka_bootstrap), group, generation=7)
    assert mirror.commit({(topic, 0): 3, (topic, 1): 4})
    assert mirror.commit({(topic, 0): 7, (topic, 2): 1})  # later batches: the latest offset wins
    assert (mirror.commits, mirror.failures) == (2, 0)
    expected = {(topic, 0): 7, (topic, 1): 4, (topic, 2): 1}

    assert group_offsets(KafkaSettings(kafka_bootstrap), group) == expected
    listed = kafka_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions} == expected
    # the run's generation rides in the offset commit metadata (small, versioned)
    assert {tp.metadata for tp in listed.topic_partitions} == {"txn_offsets:v1:g=7"}

    rows = describe_group(group)
    header = next(r for r in rows if r[:2] == ["GROUP", "TOPIC"])
    col = {name: i for i, name in enumerate(header)}
    described = {
        (r[col["TOPIC"]], int(r[col["PARTITION"]])): (int(r[col["CURRENT-OFFSET"]]), int(r[col["LAG"]]))
        for r in rows
        if r[0] == group
    }
    assert described == {(topic, 0): (7, 3), (topic, 1): (4, 0), (topic, 2): (1, 5)}
    mirror.close()
    assert mirror.commit({(topic, 0): 9}) is False  # closed: ignored, no exception


def test_unreachable_kafka_costs_a_bounded_wait_a_warning_and_a_counter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[str] = []
    mirror = GroupMirror(
        KafkaSettings("127.0.0.1:1"),
        "job-x",
        timeout_s=1.0,
        backoff_s=60.0,
        on_failure=lambda: counted.append("mirror_failed"),
    )
    started = time.monotonic()
    assert mirror.commit({("t", 0): 5}) is False
    assert time.monotonic() - started < 5
    assert (mirror.failures, mirror.commits, counted) == (1, 0, ["mirror_failed"])
    assert (
        "mirror of group 'job-x' to Kafka failed" in caplog.text and "database commit stands" in caplog.text
    )
    started = time.monotonic()
    assert mirror.commit({("t", 0): 6}) is False  # within the backoff: not even tried
    assert time.monotonic() - started < 0.5 and mirror.skipped == 1 and mirror.failures == 1


def test_a_partition_kafka_rejects_does_not_block_the_others(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = _ready_topic(topic_factory, kafka_bootstrap, 2)
    group = f"job-{uuid.uuid4().hex[:8]}"
    mirror = GroupMirror(KafkaSettings(kafka_bootstrap), group, backoff_s=0.0)
    gone = f"gone-{uuid.uuid4().hex[:8]}"  # e.g. a topic deleted since the job read it
    assert mirror.commit({(topic, 0): 2, (gone, 0): 1}) is False
    assert mirror.failures == 1
    assert mirror.commit({(topic, 1): 3})  # the rejected partition is not sent again
    assert group_offsets(KafkaSettings(kafka_bootstrap), group) == {(topic, 0): 2, (topic, 1): 3}


def test_group_inputs(kafka_bootstrap: str) -> None:
    assert group_offsets(KafkaSettings(kafka_bootstrap), f"never-{uuid.uuid4().hex[:8]}") == {}
    for bad in ("", " padded ", "tab\there"):
        with pytest.raises(ConfigError, match="consumer group id"):
            GroupMirror(KafkaSettings(kafka_bootstrap), bad)


def _listed(kafka_admin: AdminClient, group: str) -> dict[tuple[str, int], tuple[int, str | None]]:
    listed = kafka_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {(tp.topic, tp.partition): (tp.offset, tp.metadata) for tp in listed.topic_partitions}


def test_an_older_generation_never_overwrites_a_newer_one(
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = _ready_topic(topic_factory, kafka_bootstrap, 3)
    group = f"job-{uuid.uuid4().hex[:8]}"
    kafka = KafkaSettings(kafka_bootstrap)
    newer = GroupMirror(kafka, group, generation=5)
    assert newer.commit({(topic, 0): 200})
    older = GroupMirror(kafka, group, generation=4)  # e.g. a fenced run's publisher, still sending
    caplog.set_level(logging.INFO, logger="txn_offsets.kafka.mirror")
    assert older.commit({(topic, 0): 100, (topic, 1): 50})
    assert older.commit({(topic, 0): 120})
    # partition 0 keeps the newer run's entry; partition 1 (no newer entry) takes the older run's
    assert _listed(kafka_admin, group) == {
        (topic, 0): (200, "txn_offsets:v1:g=5"),
        (topic, 1): (50, "txn_offsets:v1:g=4"),
    }
    assert (older.superseded, older.failures) == (2, 0)
    assert caplog.text.count("newer generation") == 1  # INFO once per mirror, then only counted
    # the newer run overwrites the older run's entries, and an entry of another tool is overwritten
    kafka_admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [KafkaTP(topic, 2, 9, metadata="some-tool")])]
    )[group].result(30)
    assert newer.commit({(topic, 1): 60, (topic, 2): 10})
    assert group_offsets(kafka, group) == {(topic, 0): 200, (topic, 1): 60, (topic, 2): 10}
    assert newer.superseded == 0


def test_a_partition_never_moves_backwards_within_a_run(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = _ready_topic(topic_factory, kafka_bootstrap, 1)
    group = f"job-{uuid.uuid4().hex[:8]}"
    mirror = GroupMirror(KafkaSettings(kafka_bootstrap), group, generation=3)
    assert mirror.commit({(topic, 0): 7}, topic_ids={(topic, 0): "id-a"})
    assert mirror.commit({(topic, 0): 5})  # e.g. a batch reported late: the higher offset stays
    assert mirror.flush()
    assert group_offsets(KafkaSettings(kafka_bootstrap), group) == {(topic, 0): 7}
    # the topic was deleted and created again (a new topic id): its offsets start over
    assert mirror.commit({(topic, 0): 2}, topic_ids={(topic, 0): "id-b"})
    assert group_offsets(KafkaSettings(kafka_bootstrap), group) == {(topic, 0): 2}
    assert (mirror.commits, mirror.superseded, mirror.failures) == (4, 0, 0)


@pytest.fixture
def stats_db(database_url: str, pg_schema: str) -> DatabaseSettings:
    settings = DatabaseSettings(database_url, schema=pg_schema)
    migrate.upgrade(settings)
    return settings


def _committed(topic: str, until: int) -> list[TaskReport]:
    return [TaskReport(OffsetRange(topic, 0, 0, until), "committed", until)]


def test_a_fenced_or_failed_run_never_moves_the_group_backwards(
    engine: sa.Engine,
    stats_db: DatabaseSettings,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    job_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Run A (generation 1) is fenced by run B (generation 2) of the same job and mirror group."""
    topic = _ready_topic(topic_factory, kafka_bootstrap, 1)
    group = f"{job_name}-mirror"
    kafka = KafkaSettings(kafka_bootstrap)

    def publisher(generation: int, mirror_group: str = group) -> BatchPublisher:
        return BatchPublisher(
            Store(engine, stats_db),
            kafka,
            job_name,
            mirror_group=mirror_group,
            on_batch=None,
            generation=generation,
        )

    run_b = publisher(2)
    run_b.batch_committed(None, 0.1, _committed(topic, 200))
    run_b.close()
    assert group_offsets(kafka, group) == {(topic, 0): 200}

    # A learns it was fenced: its queued commit is dropped and close() flushes nothing
    run_a = publisher(1)
    run_a.batch_committed(None, 0.1, _committed(topic, 100))
    run_a.run_failed(Fenced(job_name, 1, 2))
    run_a.close()
    assert group_offsets(kafka, group) == {(topic, 0): 200}
    # a zombie of A that never learns it was fenced (stopped by a signal): its sends and its
    # close()'s flush find B's newer generation and skip the partition
    zombie = publisher(1)
    zombie.batch_committed(None, 0.1, _committed(topic, 100))
    zombie.close()
    assert _listed(kafka_admin, group) == {(topic, 0): (200, "txn_offsets:v1:g=2")}

    # a failed run's commits still queued behind a slow statistic are dropped, not sent
    caplog.set_level(logging.INFO, logger="txn_offsets.kafka.mirror")
    other = f"{job_name}-failed"
    failed = publisher(3, other)
    gate = threading.Event()
    failed._background.submit(gate.wait, 30)  # the background thread is busy
    failed.batch_committed(None, 0.1, _committed(topic, 50))
    failed.run_failed(RuntimeError("the batch failed"))
    gate.set()
    failed.close()
    assert group_offsets(kafka, other) == {}
    assert "mirror of group" in caplog.text and "not sent" in caplog.text

    t = tables_for(stats_db.schema).stats
    with engine.connect() as conn:
        row = conn.execute(sa.select(t).where(t.c.job == job_name)).one()
    assert (row.batches, row.committed, row.fenced) == (4, 4, 1)
