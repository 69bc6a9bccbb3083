"""Wide reads with Kafka's own Fetch (kafka.fetcher) against the real broker: exactly the records
librdkafka reads for each range - every codec as librdkafka's producer and Kafka's Java producer
write it, headers, null and empty keys and values, timestamps, transactions committed and aborted,
both isolation levels - and what it does not read itself (a batch that does not decode, a topic id
the leader does not hold, settings it cannot speak) left to librdkafka from where it got, never a
record twice or missed."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings, kafka_from_env
from txn_offsets.devstack.kafka import ensure_libs, java_binary
from txn_offsets.kafka import batches, fetcher, metadata
from txn_offsets.kafka.reader import read_range, read_ranges
from txn_offsets.ranges import OffsetRange

PARTS = 10
#: partition -> the producer settings its records are written with
CODECS = {1: "gzip", 2: "zstd", 3: "lz4", 4: "snappy"}
ABORTED = {5, 6}  # partitions with an aborted transaction between committed ones


def _fill(bootstrap: str, topic: str) -> None:
    """Per partition: 30 records of varied shapes (5 of them in a committed transaction, and in
    ABORTED 5 more in an aborted one between), each partition with its codec."""
    plain: dict[str, Producer] = {}
    recent = int(time.time() * 1000) - 60_000  # records older than the retention (7 days) are deleted
    for part in range(PARTS):
        codec = CODECS.get(part, "none")
        producer = plain.setdefault(
            codec, Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5})
        )
        for i in range(25):
            key = None if i % 7 == 0 else b"" if i % 7 == 1 else f"k{i}".encode()
            value = None if i % 5 == 0 else b"" if i % 5 == 1 else f"p{part}-{i}".encode() * (1 + i % 4)
            headers: list[tuple[str, str | bytes | None]] | None = (
                [("h", b"v"), ("n", None), ("h", f"{i}".encode())] if i % 3 == 0 else None
            )
            producer.produce(
                topic, key=key, value=value, partition=part, headers=headers, timestamp=recent + i
            )
    for producer in plain.values():
        assert producer.flush(30) == 0
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    tx.init_transactions(30)
    for commit in (False, True):
        tx.begin_transaction()
        for part in range(PARTS):
            if commit or part in ABORTED:
                for i in range(5):
                    tx.produce(topic, value=f"t{part}-{commit}-{i}".encode(), partition=part)
        tx.flush(30)
        tx.commit_transaction(30) if commit else tx.abort_transaction(30)


@pytest.fixture(scope="module")
def filled(
    kafka_bootstrap: str, kafka_admin: AdminClient
) -> Iterator[tuple[str, dict[tuple[str, int], int]]]:
    topic = f"wide-{uuid.uuid4().hex[:12]}"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=PARTS, replication_factor=1)])[topic].result(30)
    _fill(kafka_bootstrap, topic)
    yield topic, settled_ends(KafkaSettings(kafka_bootstrap), topic, PARTS)
    kafka_admin.delete_topics([topic], operation_timeout=30)[topic].result(30)


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_wide_reads_are_what_librdkafka_reads(
    kafka_bootstrap: str, filled: tuple[str, dict[tuple[str, int], int]], isolation: str
) -> None:
    topic, ends = filled
    kafka = KafkaSettings(kafka_bootstrap, isolation_level=isolation)
    topic_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    for cut in (0, 3, 17, 26, 31):  # starts: 0, inside a batch, at the transactions, near the end
        ranges = [
            OffsetRange(topic, p, min(cut, ends[(topic, p)]), ends[(topic, p)], topic_id)
            for p in range(PARTS)
        ]
        alone = {r.key: list(read_range(kafka, r)) for r in ranges}
        read, left = fetcher.read_wide(kafka, ranges)
        # what it read is each range's head, what it left starts where that head ends
        for r in ranges:
            rest = [x for x in left if x.key == r.key]
            got = read[r.key] + [rec for x in rest for rec in read_range(kafka, x)]
            assert got == alone[r.key], (isolation, cut, r)
        assert left == [], (isolation, cut)  # every codec decoded here
        assert read_ranges(kafka, ranges) == alone  # the reader's own way: wide first, then the rest
    whole = [OffsetRange(topic, p, 0, ends[(topic, p)]) for p in range(PARTS)]
    committed = [r.value for r in read_ranges(kafka, whole)[(topic, 5)]]
    assert committed[-5:] == [f"t5-True-{i}".encode() for i in range(5)]
    assert (b"t5-False-0" in committed) == (isolation == "read_uncommitted")


def test_a_read_in_many_rounds_is_whole(
    kafka_bootstrap: str, filled: tuple[str, dict[tuple[str, int], int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte limits far below a batch: each answer holds a batch cut short, or a few whole ones;
    the read goes on round after round (a partition's limit doubled when its batch did not fit)
    until every range is complete."""
    topic, ends = filled
    kafka = KafkaSettings(kafka_bootstrap)
    ranges = [OffsetRange(topic, p, 0, ends[(topic, p)]) for p in (0, 7, 8, 9)]
    monkeypatch.setattr(fetcher, "PARTITION_MIN_BYTES", 64)
    monkeypatch.setattr(fetcher, "PARTITION_MAX_BYTES", 64)
    monkeypatch.setattr(fetcher, "MAX_BYTES", 200)
    asked: list[dict[int, int]] = []
    real_send = fetcher.direct.send_fetch

    def send(*args: Any, **kwargs: Any) -> int:
        asked.append(dict(kwargs["partition_max_bytes"]))
        return int(real_send(*args, **kwargs))

    monkeypatch.setattr(fetcher.direct, "send_fetch", send)
    rounds: list[int] = []
    real = fetcher._ask

    def ask(*args: Any) -> Any:
        rounds.append(1)
        return real(*args)

    monkeypatch.setattr(fetcher, "_ask", ask)
    read, left = fetcher.read_wide(kafka, ranges)
    assert left == []
    assert read == {r.key: list(read_range(kafka, r)) for r in ranges}
    assert len(rounds) > 4
    # each partition starts at 64 bytes; one that did not move though its log goes on (its batch
    # did not fit) asks for twice as much the next round
    assert {v for limits in asked[:1] for v in limits.values()} == {64}
    assert max(v for limits in asked for v in limits.values()) > 64
    assert sum(len(v) for v in read.values()) == 4 * 30


def test_a_topic_id_the_leader_does_not_hold_is_left_to_librdkafka(
    kafka_bootstrap: str, filled: tuple[str, dict[tuple[str, int], int]]
) -> None:
    topic, ends = filled
    kafka = KafkaSettings(kafka_bootstrap)
    ranges = [OffsetRange(topic, p, 2, ends[(topic, p)], "AAAAAAAAAAAAAAAAAAAAAA") for p in (0, 7)]
    read, left = fetcher.read_wide(kafka, ranges)
    assert read == {r.key: [] for r in ranges}
    assert left == ranges


def test_settings_it_cannot_speak_leave_the_read_to_librdkafka() -> None:
    kafka = KafkaSettings(
        "192.0.2.1:9", extra={"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    )
    ranges = [OffsetRange("t", p, 0, 5) for p in range(3)]
    assert fetcher.read_wide(kafka, ranges) == ({}, ranges)


def test_a_broker_that_does_not_answer_leaves_the_read_to_librdkafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "TIMEOUT_S", 0.2)
    kafka = KafkaSettings("127.0.0.1:9")  # discard port: refused at once
    ranges = [OffsetRange("t", p, 3, 5) for p in range(2)]
    read, left = fetcher.read_wide(kafka, ranges)
    assert left == ranges and read == {r.key: [] for r in ranges}


def test_over_sasl_ssl_a_wide_read_is_what_librdkafka_reads(
    kafka_bootstrap: str, filled: tuple[str, dict[tuple[str, int], int]]
) -> None:
    config = os.environ.get("TXN_OFFSETS_TLS_KAFKA_CONFIG")
    assert config, "TXN_OFFSETS_TLS_KAFKA_CONFIG is not set: start the stack with `make stack-up TLS=1`"
    kafka = kafka_from_env({}, config_file=Path(config))
    topic, ends = filled
    ranges = [OffsetRange(topic, p, 1, ends[(topic, p)]) for p in (0, 1, 2, 7)]
    read, left = fetcher.read_wide(kafka, ranges)
    assert left == []
    assert read == {r.key: list(read_range(KafkaSettings(kafka_bootstrap), r)) for r in ranges}


def test_log_append_time_is_the_brokers_as_librdkafka_gives_it(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=2, config={"message.timestamp.type": "LogAppendTime"})
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for i in range(20):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2, timestamp=1_000 + i)
    assert producer.flush(30) == 0
    kafka = KafkaSettings(kafka_bootstrap)
    ranges = [OffsetRange(topic, p, 0, 10) for p in range(2)]
    read, left = fetcher.read_wide(kafka, ranges)
    assert left == []
    assert read == {r.key: list(read_range(kafka, r)) for r in ranges}
    stamps = {rec.timestamp_ms for recs in read.values() for rec in recs}
    assert stamps and all(t is not None and t > 1_700_000_000_000 for t in stamps)  # not the producer's


def test_a_range_read_partly_here_is_finished_by_librdkafka_from_where_it_got(
    kafka_bootstrap: str, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain batches, then lz4 ones that do not decode here (the decoder made to refuse lz4, as it
    refuses a body that does not decompress): the plain head is read here, the range's rest (from
    the first lz4 batch) by librdkafka, and the two parts are the range read alone."""
    real = batches._decompress

    def no_lz4(codec: int, body: bytes, base: int) -> bytes:
        if codec == 3:
            raise batches.Undecodable(
                f"a record batch compressed with lz4 at offset {base} does not decompress"
            )
        return real(codec, body, base)

    monkeypatch.setattr(batches, "_decompress", no_lz4)
    topic = topic_factory(partitions=2)
    for codec in ("none", "lz4"):
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": codec, "linger.ms": 5})
        for i in range(20):
            producer.produce(topic, value=f"{codec}-{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
    kafka = KafkaSettings(kafka_bootstrap)
    ranges = [OffsetRange(topic, p, 3, 20) for p in range(2)]
    read, left = fetcher.read_wide(kafka, ranges)
    assert left == [OffsetRange(topic, p, 10, 20) for p in range(2)]
    assert all([r.offset for r in read[(topic, p)]] == list(range(3, 10)) for p in range(2))
    alone = {r.key: list(read_range(kafka, r)) for r in ranges}
    assert read_ranges(kafka, ranges) == alone
    assert [r.value for r in alone[(topic, 1)]][-1] == b"lz4-19"


#: Kafka's Java producer (the broker's own kafka-clients jar, run as a single-file source program):
#: per partition one producer with that partition's codec - snappy in xerial blocks, Java's lz4
#: frames, zstd-jni's frames, gzip
JAVA_PRODUCER = """
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Produce {
    public static void main(String[] args) throws Exception {
        for (int part = 2; part < args.length; part++) {
            Properties props = new Properties();
            props.put("bootstrap.servers", args[0]);
            props.put("compression.type", args[part]);
            props.put("linger.ms", "50");
            props.put("key.serializer", ByteArraySerializer.class.getName());
            props.put("value.serializer", ByteArraySerializer.class.getName());
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                for (int i = 0; i < 300; i++) {
                    byte[] key = i % 9 == 0 ? null : ("k" + i).getBytes("UTF-8");
                    byte[] value = (args[part] + "-" + i + ";").repeat(1 + i % 7).getBytes("UTF-8");
                    producer.send(new ProducerRecord<>(args[1], part - 2, key, value));
                }
                producer.flush();
            }
        }
    }
}
"""
JAVA_CODECS = ("snappy", "lz4", "zstd", "gzip")


def test_batches_of_kafkas_java_producer_are_what_librdkafka_reads(
    kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    framed: list[bool] = []  # per snappy batch decoded: in xerial blocks (the Java producer's way)
    real = batches._snappy
    monkeypatch.setattr(
        batches, "_snappy", lambda body: framed.append(body.startswith(batches._XERIAL)) or real(body)
    )
    topic = topic_factory(partitions=len(JAVA_CODECS))
    source = tmp_path / "Produce.java"
    source.write_text(JAVA_PRODUCER)
    classpath = f"{ensure_libs()}/*"
    done = subprocess.run(
        [java_binary(), "-cp", classpath, str(source), kafka_bootstrap, topic, *JAVA_CODECS],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kafka = KafkaSettings(kafka_bootstrap)
    ends = settled_ends(kafka, topic, len(JAVA_CODECS))
    assert set(ends.values()) == {300}
    for start in (0, 137):  # from the log's start, and from inside a batch
        ranges = [OffsetRange(topic, p, start, 300) for p in range(len(JAVA_CODECS))]
        read, left = fetcher.read_wide(kafka, ranges)
        assert left == [], start
        alone = {r.key: list(read_range(kafka, r)) for r in ranges}
        assert read == alone, start
        for p, codec in enumerate(JAVA_CODECS):
            assert [r.offset for r in read[(topic, p)]] == list(range(start, 300))
            assert read[(topic, p)][-1].value == f"{codec}-299;".encode() * (1 + 299 % 7)
    assert framed and all(framed)
