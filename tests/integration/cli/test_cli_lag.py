"""`txn-offsets offsets lag` end to end, through cli.main, against real PostgreSQL and Kafka:
the end offset is the LSO (an open transaction bounds it), partitions added later are shown, and
bad input is one error line with exit code 1."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.integration.helpers import Cli, produce_counts, seed
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


def _row(out: str, topic: str, part: int) -> list[str]:
    (line,) = [ln for ln in out.splitlines() if re.match(rf"{re.escape(topic)}\s+{part}\s", ln)]
    return line.split()


def test_lag_per_partition_and_total_at_the_lso(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: Callable[..., str],
) -> None:
    s = ["--schema", migrated.schema]
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 5, 1: 3})  # p0: offsets 0-4, p1: 0-2
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 2, (topic, 1): 1})

    code, out, err = run_cli("offsets", "lag", "--job", job_name, *s)
    assert code == 0, err
    assert out.splitlines()[0].split() == ["TOPIC", "PARTITION", "OFFSET", "END", "LAG", "LAG_S", "NOTE"]
    assert _row(out, topic, 0)[:5] == [topic, "0", "2", "5", "3"]
    assert _row(out, topic, 1)[:5] == [topic, "1", "1", "3", "2"]
    assert out.splitlines()[-1].startswith(
        f"total lag of job {job_name!r}: 5 offsets over 2 partition(s) (end offsets at read_committed); "
        f"oldest unprocessed record "
    )

    # an open Kafka transaction on p1: read_committed readers cannot pass it, so the end is the
    # LSO (3), not the high watermark (5) - exactly what the planner would plan to
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, value=f"open{i}".encode(), partition=1)
    producer.flush(30)
    code, out, _ = run_cli("offsets", "lag", "--job", job_name, *s)
    assert code == 0
    assert _row(out, topic, 1)[:5] == [topic, "1", "1", "3", "2"]
    # once aborted, the end moves past the two aborted records and the abort marker (3 + 2 + 1):
    # lag counts offsets, an upper bound on the records a reader will see
    producer.flush(30)
    producer.abort_transaction(30)
    settled_ends(kafka_bootstrap, topic, 2)  # abort_transaction returns before the marker is written
    code, out, _ = run_cli("offsets", "lag", "--job", job_name, *s)
    assert _row(out, topic, 1)[:5] == [topic, "1", "1", "6", "5"]
    assert "total lag" in out and ": 8 offsets over 2 partition(s)" in out

    # a partition added to the topic has no row yet: shown, counted from its log start
    kafka_admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    produce_counts(kafka_bootstrap, topic, {2: 4})
    code, out, _ = run_cli("offsets", "lag", "--job", job_name, "--kafka-bootstrap", kafka_bootstrap, *s)
    assert code == 0
    assert _row(out, topic, 2)[:5] == [topic, "2", "-", "4", "4"] and "new partition" in out
    assert ": 12 offsets over 3 partition(s)" in out.splitlines()[-1]


def test_lag_of_a_job_without_offsets(run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings) -> None:
    job = f"job-{uuid.uuid4().hex[:10]}"
    start_run(Store(engine, migrated), job)
    code, out, err = run_cli("offsets", "lag", "--job", job, "--schema", migrated.schema)
    assert code == 0, err
    assert out.splitlines()[-1] == f"total lag of job {job!r}: 0 offsets over 0 partition(s) " + (
        "(end offsets at read_committed)"
    )


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--job", "ghost"], {}, "unknown job 'ghost'"),
        (["--job", "x"], {"TXN_OFFSETS_DATABASE_URL": None}, "TXN_OFFSETS_DATABASE_URL: is not set"),
        (["--job", "x"], {"TXN_OFFSETS_KAFKA_BOOTSTRAP": None}, "TXN_OFFSETS_KAFKA_BOOTSTRAP: is not set"),
    ],
)
def test_lag_errors_are_one_line(
    run_cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    migrated: DatabaseSettings,
    argv: list[str],
    env: dict[str, str | None],
    message: str,
) -> None:
    for name in env:
        monkeypatch.delenv(name)
    code, out, err = run_cli("offsets", "lag", *argv, "--schema", migrated.schema)
    assert code == 1 and out == ""
    assert err.startswith("txn-offsets: error:") and message in err and err.count("\n") == 1


def test_lag_of_a_deleted_topic_names_it(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    missing = f"gone-{uuid.uuid4().hex[:8]}"
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(missing, 0): 0})
    code, _, err = run_cli("offsets", "lag", "--job", job_name, "--schema", migrated.schema)
    assert code == 1 and f"topic {missing!r} does not exist" in err and err.count("\n") == 1


def test_lag_json_seconds_and_fail_over(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    """JSON for scripts; lag in seconds from the record timestamps; --fail-over as an exit code."""
    s = ["--schema", migrated.schema]
    topic = topic_factory(partitions=2)
    old_ms = int(time.time() * 1000) - 3_600_000  # the first records are an hour old
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(4):
        producer.produce(topic, value=b"x", partition=0, timestamp=old_ms + i * 1000)
    producer.produce(topic, value=b"y", partition=1)
    assert producer.flush(30) == 0
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 1, (topic, 1): 1})  # p1 is caught up

    code, out, err = run_cli("offsets", "lag", "--job", job_name, "--format", "json", *s)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["job"] == job_name and doc["total_lag"] == 3 and doc["isolation_level"] == "read_committed"
    p0, p1 = doc["partitions"]
    assert (p0["topic"], p0["partition"], p0["offset"], p0["end"], p0["lag"]) == (topic, 0, 1, 4, 3)
    # the record at offset 1 was stamped an hour (+1 s) ago
    assert 3595 < p0["lag_seconds"] < 3700
    assert (p1["lag"], p1["lag_seconds"]) == (0, 0.0)
    assert 3595 < doc["max_lag_seconds"] < 3700

    code, out, err = run_cli("offsets", "lag", "--job", job_name, "--fail-over", "3", *s)
    assert (code, err) == (0, "")
    code, out, err = run_cli("offsets", "lag", "--job", job_name, "--fail-over", "2", *s)
    assert code == 3 and "total lag" in out
    assert err == f"txn-offsets: lag of job {job_name!r} is 3 offsets, over --fail-over 2\n"
    code, _, err = run_cli("offsets", "lag", "--job", job_name, "--fail-over", "-1", *s)
    assert code == 64 and "--fail-over" in err and err.count("\n") == 1
