"""Exactly once over TLS and SASL: PostgreSQL with ``sslmode=verify-full`` and Kafka's SASL_SSL
listener (SCRAM-SHA-512), the stack's throwaway CA (``make stack-up TLS=1``, or a TLS stack started
here for the module). The job, the consumer-group mirror, the Structured Streaming source, the CLI
and ``serve`` run end to end; a wrong password is a ConfigError naming the setting; the password
shows up nowhere (reprs, errors, CLI output, a failing Spark task's error text).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.spark.counting import (
    counting_writer,
    create_counts,
    key_of,
    produce_keyed,
    stored_offsets,
    stream_once,
    totals,
)
from tests.kafka_ends import settled_ends
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings, KafkaSettings, kafka_from_env
from txn_offsets.errors import ConfigError, TxnOffsetsError
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store import migrate, offset_rows
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


@dataclass(frozen=True)
class Tls:
    database_url: str  # the app role, sslmode=verify-full, sslrootcert=the stack's CA
    kafka_config: Path  # librdkafka properties: SASL_SSL, SCRAM-SHA-512, user, password, CA
    ca: Path

    @property
    def kafka(self) -> KafkaSettings:
        return kafka_from_env({}, config_file=self.kafka_config)

    @property
    def password(self) -> str:
        secret = self.kafka.extra["sasl.password"]
        return str(secret.get())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    """The stack's TLS endpoints (TXN_OFFSETS_TLS_*), else a TLS stack of its own for the module."""
    url, config = (
        os.environ.get("TXN_OFFSETS_TLS_DATABASE_URL"),
        os.environ.get("TXN_OFFSETS_TLS_KAFKA_CONFIG"),
    )
    if url and config:
        yield Tls(url, Path(config), Path(os.environ["TXN_OFFSETS_TLS_CA"]))
        return
    from txn_offsets.devstack import Stack

    stack = Stack(tmp_path_factory.mktemp("tls-stack"))
    try:
        stack.up(tls_on=True)
        env = stack.env()
        yield Tls(
            env["TXN_OFFSETS_TLS_DATABASE_URL"],
            Path(env["TXN_OFFSETS_TLS_KAFKA_CONFIG"]),
            Path(env["TXN_OFFSETS_TLS_CA"]),
        )
    finally:
        stack.down()
        data = stack._pg(stack._state()).data_dir.parent  # may be under /var/lib/txn-offsets
        if data.is_relative_to("/var/lib/txn-offsets"):  # the tmp dir was out of the postgres user's reach
            shutil.rmtree(data.parent, ignore_errors=True)


@pytest.fixture
def db(tls: Tls) -> Iterator[DatabaseSettings]:
    settings = DatabaseSettings(tls.database_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(settings)
    yield settings
    eng = sa.create_engine(settings.url)
    with eng.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{settings.schema}" CASCADE'))
    eng.dispose()


@pytest.fixture
def tls_engine(db: DatabaseSettings) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db.url, poolclass=sa.NullPool)
    yield eng
    eng.dispose()


def make_topic(kafka: KafkaSettings, partitions: int) -> str:
    name = f"tls-{uuid.uuid4().hex[:12]}"
    admin = AdminClient(kafka.client_config())
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    return name


def test_the_endpoints_verify_and_encrypt(tls: Tls, tmp_path: Path) -> None:
    url = sa.engine.make_url(tls.database_url)
    assert url.query["sslmode"] == "verify-full"
    info = {
        "host": url.host,
        "port": url.port,
        "user": url.username,
        "password": url.password,
        "dbname": url.database,
    }
    with psycopg.connect(**info, sslmode="verify-full", sslrootcert=str(tls.ca)) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    other_ca = tmp_path / "other-ca.pem"  # a CA that did not sign the server's certificate
    shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", other_ca)
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(**info, sslmode="verify-full", sslrootcert=str(other_ca), connect_timeout=5)
    kafka = tls.kafka
    assert kafka.extra["security.protocol"] == "SASL_SSL" and kafka.extra["sasl.mechanism"] == "SCRAM-SHA-512"
    plain = KafkaSettings(kafka.bootstrap_servers)  # the SASL_SSL port speaks nothing else
    with pytest.raises(KafkaException):
        AdminClient({**plain.client_config(), "socket.timeout.ms": 2000}).list_topics(timeout=3)


def test_job_mirror_and_stream_are_exact_over_verify_full_and_sasl_ssl(
    spark: Any, tls: Tls, db: DatabaseSettings, tls_engine: sa.Engine, tmp_path: Path
) -> None:
    kafka = tls.kafka
    topic = make_topic(kafka, 4)
    expected = produce_keyed(kafka, topic, 2000, 4, keys=31)
    counts = create_counts(tls_engine, db.schema)

    job, group = f"job-{uuid.uuid4().hex[:10]}", f"grp-{uuid.uuid4().hex[:10]}"
    summary = run_job(
        spark,
        job=job,
        kafka=kafka,
        database=db,
        writer=counting_writer(counts),
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_partition=300),
        until_caught_up=True,
        mirror_group=group,
    )
    ends = settled_ends(kafka, topic, 4)
    assert summary.records == 2000 and totals(tls_engine, counts) == dict(expected)
    assert stored_offsets(tls_engine, db, job) == ends
    assert dict(group_offsets(kafka, group)) == ends  # the consumer-group mirror, over SASL_SSL

    # the Structured Streaming source and sink: a second job over the same topic, same totals again
    stream_job = f"stream-{uuid.uuid4().hex[:10]}"
    stream_once(
        spark,
        counts,
        job=stream_job,
        kafka=kafka,
        database=db,
        topics=[topic],
        limits=Limits(max_records_per_batch=1000),
        checkpoint_root=str(tmp_path),
    )
    assert totals(tls_engine, counts) == {k: 2 * n for k, n in expected.items()}
    assert stored_offsets(tls_engine, db, stream_job) == ends


def test_a_failing_task_and_a_wrong_password_show_no_secret(
    spark: Any, tls: Tls, db: DatabaseSettings, tls_engine: sa.Engine
) -> None:
    kafka = tls.kafka
    assert tls.password not in repr(kafka) and "'sasl.password': '***'" in repr(kafka)
    assert tls.password not in repr(kafka.extra) and tls.password not in repr(db)
    topic = make_topic(kafka, 2)
    produce_keyed(kafka, topic, 20, 2, keys=31)

    def boom(conn: sa.Connection, rng: OffsetRange, agg: list[str]) -> None:
        raise ValueError("the user's write failed")

    writer = PartitionWriter(write=boom, decode=key_of, aggregate=list)
    job = f"job-{uuid.uuid4().hex[:10]}"
    with pytest.raises(TxnOffsetsError) as failed:  # retried once (the retry's warning logged), then raised
        run_job(spark, job=job, kafka=kafka, database=db, writer=writer, topics=[topic],
                start=StartPolicy.earliest(), until_caught_up=True, retries=1,
                retry_backoff_s=0.1)  # fmt: skip
    text = "".join([str(failed.value), repr(failed.value), str(failed.value.__cause__)])
    assert "ValueError" in text and "write" in text, text  # the task's error reached the driver ...
    db_password = str(db.url.password)
    assert tls.password not in text and db_password not in text  # ... without a secret
    assert stored_offsets(tls_engine, db, job) == {(topic, 0): 0, (topic, 1): 0}

    wrong = KafkaSettings(kafka.bootstrap_servers, {**kafka.extra, "sasl.password": "wr0ng-pass"})
    with pytest.raises(ConfigError, match=r"sasl\.username/sasl\.password") as refused:
        run_job(spark, job=job, kafka=wrong, database=db, writer=writer, topics=[topic],
                start=StartPolicy.earliest(), until_caught_up=True)  # fmt: skip
    assert "refused the SCRAM-SHA-512 login of user 'txn_offsets'" in str(refused.value)
    assert "wr0ng-pass" not in str(refused.value) and tls.password not in str(refused.value)


def _cli(tls: Tls, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXN_OFFSETS_KAFKA")}
    env["TXN_OFFSETS_DATABASE_URL"] = tls.database_url
    return subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", *args, "--kafka-config", str(config or tls.kafka_config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _seed(db: DatabaseSettings, job: str, topic: str) -> None:
    """A finished run of `job` at offset 5 of both partitions."""
    engine = engine_for(db)
    try:
        run = start_run(Store(engine, db), job)
        with engine.begin() as conn:
            offset_rows.seed_offsets(
                conn, db, job, {(topic, 0): 0, (topic, 1): 0}, reason="test", actor="pytest"
            )
        commit_ranges(Store(engine, db), run, [OffsetRange(topic, p, 0, 5) for p in (0, 1)])
    finally:
        engine.dispose()


def test_cli_and_serve_take_the_properties_file(
    tls: Tls, db: DatabaseSettings, tls_engine: sa.Engine, tmp_path: Path
) -> None:
    kafka = tls.kafka
    topic = make_topic(kafka, 2)
    produce_keyed(kafka, topic, 20, 2, keys=31)  # 10 per partition
    job = f"job-{uuid.uuid4().hex[:10]}"
    _seed(db, job, topic)
    common = ("--schema", db.schema, "--job", job, "--format", "json")
    lag = _cli(tls, "offsets", "lag", *common)
    assert lag.returncode == 0, lag.stderr
    rows = json.loads(lag.stdout)
    rows = rows["partitions"] if isinstance(rows, dict) and "partitions" in rows else rows
    assert sorted((r["partition"], r["offset"], r["lag"]) for r in rows) == [(0, 5, 5), (1, 5, 5)]
    assert tls.password not in lag.stdout + lag.stderr

    bad = tmp_path / "wrong.properties"
    bad.write_text(tls.kafka_config.read_text().replace(tls.password, "wr0ng-pass"))
    refused = _cli(tls, "offsets", "lag", *common, config=bad)
    assert refused.returncode != 0 and "sasl.username/sasl.password" in refused.stderr, refused.stderr
    assert "wr0ng-pass" not in refused.stdout + refused.stderr
    typo = tmp_path / "typo.properties"
    typo.write_text(tls.kafka_config.read_text() + "sasl.pasword=hunter2-typo\n")
    named = _cli(tls, "offsets", "lag", *common, config=typo)
    assert named.returncode != 0 and "'sasl.pasword'" in named.stderr and str(typo) in named.stderr, (
        named.stderr
    )
    assert "hunter2-typo" not in named.stdout + named.stderr and tls.password not in named.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("TXN_OFFSETS_KAFKA")}
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    env |= {"TXN_OFFSETS_DATABASE_URL": tls.database_url, "TXN_OFFSETS_KAFKA_CONFIG": str(tls.kafka_config)}
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", db.schema, "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", proc.stdout.readline())
        assert match, proc.stderr.read() if proc.stderr else ""
        with httpx.Client(timeout=20) as client:
            body = client.get(f"{match.group(1)}/offsets/{job}")
            assert body.status_code == 200, body.text
            partitions = body.json()["partitions"]
            assert [(p["partition"], p["offset"], p["lag"]) for p in partitions] == [(0, 5, 5), (1, 5, 5)]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert tls.password not in out + err
