"""The consumer-group mirror against a real broker: what it writes is what AdminClient and Kafka's own
`kafka-consumer-groups.sh --describe` (ConsumerGroupCommand from the Kafka jars) read back, and a
broker that cannot be reached costs a bounded wait, a warning and a counter - never an exception."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.store.helpers import produce_counts
from txn_offsets._java import find_java
from txn_offsets.config import KafkaSettings
from txn_offsets.devstack.kafka import KAFKA_VERSION, cache_dir, ensure_libs
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.mirror import GroupMirror, group_offsets

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


def test_mirror_is_what_the_lag_tools_read(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory, describe_group: Describe
) -> None:
    topic = topic_factory(partitions=3)
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 4, 2: 6})
    group = f"job-{uuid.uuid4().hex[:8]}"
    mirror = GroupMirror(KafkaSettings(kafka_bootstrap), group)
    assert mirror.commit({(topic, 0): 3, (topic, 1): 4})
    assert mirror.commit({(topic, 0): 7, (topic, 2): 1})  # later batches: the latest offset wins
    assert (mirror.commits, mirror.failures) == (2, 0)
    expected = {(topic, 0): 7, (topic, 1): 4, (topic, 2): 1}

    assert group_offsets(KafkaSettings(kafka_bootstrap), group) == expected
    listed = kafka_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions} == expected

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
    topic = topic_factory(partitions=2)
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
