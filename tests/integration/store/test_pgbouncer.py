"""Exactly once through PgBouncer 1.18 in transaction mode with a pool of 2 server connections per
(database, user), fewer than the clients using it (Spark tasks, the driver, the CLI, `serve`).

PgBouncer hands each transaction to any server connection of the pool, so no session state may
outlive a transaction: psycopg's server-side prepared statements (DuplicatePreparedStatement /
"prepared statement does not exist"), temp tables left in a server session, timeouts sent as libpq
``options`` (PgBouncer drops them: a frozen holder of a claim would block forever). Statement
pooling cannot run a transaction at all and is refused with a ConfigError.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
import pytest
import sqlalchemy as sa

from tests.fix_services import Services, TopicFactory, started_pgbouncer
from tests.integration.spark.counting import (
    counting_writer,
    create_counts,
    produce_keyed,
    stored_offsets,
    stream_once,
    totals,
)
from tests.kafka_ends import settled_ends
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ClaimBlocked, ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.runner import run_job
from txn_offsets.spark.writers import BatchWriter
from txn_offsets.store import migrate, offset_rows
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run
from txn_offsets.upserts import COPY_MIN_ROWS, upsert_add

POOL_SIZE = 2  # default_pool_size of the stack's PgBouncer and of the one started here


@pytest.fixture
def pooled(pooled_database_url: str, database_url: str, pg_schema: str) -> DatabaseSettings:
    """This test's schema, migrated over a direct connection; settings that go through PgBouncer."""
    migrate.upgrade(DatabaseSettings(database_url, schema=pg_schema))
    return DatabaseSettings(pooled_database_url, schema=pg_schema, lock_timeout_s=1.0)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


@pytest.fixture
def counts(engine: sa.Engine, pg_schema: str) -> sa.Table:
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"'))
    return create_counts(engine, pg_schema)


def seed(engine: sa.Engine, db: DatabaseSettings, job: str, rows: dict[tuple[str, int], int]) -> None:
    with engine.begin() as conn:
        offset_rows.seed_offsets(conn, db, job, rows, reason="test", actor="pytest")


class PoolWatch:
    """Samples PgBouncer's SHOW POOLS (admin console) for the app role's pool while a job runs:
    the most clients at once, the most server connections, whether a client ever waited."""

    def __init__(self, services: Services, pooled_url: str) -> None:
        admin = sa.engine.make_url(services.admin_database_url)
        url = sa.engine.make_url(pooled_url)
        self.user = url.username
        self._info = {"host": url.host, "port": url.port, "user": admin.username, "password": admin.password}
        self.clients = self.servers = self.waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        with psycopg.connect(
            **self._info, dbname="pgbouncer", autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as conn:
            while not self._stop.is_set():
                cur = conn.execute("SHOW POOLS")
                names = [d.name for d in cur.description or []]
                for row in cur.fetchall():
                    pool = dict(zip(names, row, strict=True))
                    if pool["user"] != self.user:
                        continue
                    self.clients = max(self.clients, pool["cl_active"] + pool["cl_waiting"])
                    self.waiting = max(self.waiting, pool["cl_waiting"])
                    servers = sum(
                        pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
                    )
                    self.servers = max(self.servers, servers)
                time.sleep(0.02)

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def session_temp_tables(pooled_url: str) -> list[int]:
    """Temp tables in each server session of the app role's pool: POOL_SIZE transactions held open
    at once occupy every server connection of the pool."""
    engine = sa.create_engine(pooled_url, poolclass=sa.NullPool, connect_args={"prepare_threshold": None})
    conns = [engine.connect() for _ in range(POOL_SIZE)]
    try:
        found = []
        for conn in conns:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            n = conn.execute(
                sa.text("SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()")
            ).scalar_one()
            found.append((pid, int(n)))
        assert len({pid for pid, _ in found}) == POOL_SIZE, found  # every server connection seen
        return [n for _, n in found]
    finally:
        for conn in conns:
            conn.close()
        engine.dispose()


def test_partition_writer_job_is_exact_with_fewer_server_connections_than_clients(
    spark: Any,
    services: Services,
    pooled_database_url: str,
    engine: sa.Engine,
    pooled: DatabaseSettings,
    kafka: KafkaSettings,
    counts: sa.Table,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=8)
    expected = produce_keyed(kafka, topic, 4000, 8, keys=97)

    writer = counting_writer(counts)
    with PoolWatch(services, pooled_database_url) as watch:
        summary = run_job(
            spark,
            job=job_name,
            kafka=kafka,
            database=pooled,
            writer=writer,
            topics=[topic],
            start=StartPolicy.earliest(),
            limits=Limits(max_records_per_partition=250),  # 2 batches of 8 ranges: 16 claims
            until_caught_up=True,
        )
    assert totals(engine, counts) == dict(expected)
    assert stored_offsets(engine, pooled, job_name) == settled_ends(kafka.bootstrap_servers, topic, 8)
    assert summary.records == 4000 and summary.batches == 2
    assert watch.servers <= POOL_SIZE < watch.clients, (watch.servers, watch.clients, watch.waiting)


def test_batch_writer_copy_path_is_exact_and_leaves_no_session_state(
    spark: Any,
    pooled_database_url: str,
    engine: sa.Engine,
    pooled: DatabaseSettings,
    kafka: KafkaSettings,
    counts: sa.Table,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=4)
    expected = produce_keyed(kafka, topic, 3000, 4, keys=997)
    sizes: list[int] = []

    def compute_df(batch: Any) -> list[tuple[str, int]]:
        rows = batch.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
        return [(str(r.k), int(r["count"])) for r in rows]

    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]) -> None:
        sizes.append(len(rows))
        upsert_add(conn, counts, [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])

    summary = run_job(
        spark,
        job=job_name,
        kafka=kafka,
        database=pooled,
        writer=BatchWriter(compute_df=compute_df, write=write),
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=1500),
        until_caught_up=True,
    )
    assert totals(engine, counts) == dict(expected)
    assert stored_offsets(engine, pooled, job_name) == settled_ends(kafka.bootstrap_servers, topic, 4)
    assert summary.batches == 2 and min(sizes) >= COPY_MIN_ROWS, sizes  # the COPY path, twice
    assert session_temp_tables(pooled_database_url) == [0] * POOL_SIZE  # staging dropped at commit


def test_structured_streaming_sink_is_exact(
    spark: Any,
    engine: sa.Engine,
    pooled: DatabaseSettings,
    kafka: KafkaSettings,
    counts: sa.Table,
    topic_factory: TopicFactory,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=3)
    expected = produce_keyed(kafka, topic, 900, 3, keys=50)
    stream_once(
        spark,
        counts,
        job=job_name,
        kafka=kafka,
        database=pooled,
        topics=[topic],
        limits=Limits(max_records_per_batch=450),
        checkpoint_root=str(tmp_path),
    )
    assert totals(engine, counts) == dict(expected)
    assert stored_offsets(engine, pooled, job_name) == settled_ends(kafka.bootstrap_servers, topic, 3)


def _seeded(engine: sa.Engine, pooled: DatabaseSettings, job: str, topic: str, partitions: int) -> None:
    """A finished run of `job` at offset 5 of every partition (through PgBouncer)."""
    pooled_engine = engine_for(pooled)
    try:
        run = start_run(Store(pooled_engine, pooled), job)
        seed(pooled_engine, pooled, job, {(topic, p): 0 for p in range(partitions)})
        commit_ranges(
            Store(pooled_engine, pooled), run, [OffsetRange(topic, p, 0, 5) for p in range(partitions)]
        )
    finally:
        pooled_engine.dispose()


def _cli(pooled_url: str, kafka: KafkaSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": pooled_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
    }
    return subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_show_reset_lag(
    pooled_database_url: str,
    engine: sa.Engine,
    pooled: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=8)
    produce_keyed(kafka, topic, 80, 8, keys=5)  # 10 per partition
    _seeded(engine, pooled, job_name, topic, 8)
    common = ("--schema", pooled.schema, "--job", job_name)
    for _ in range(3):  # the same statements again and again, as a prepared statement would be
        show = _cli(pooled_database_url, kafka, "offsets", "show", *common, "--format", "json")
        assert show.returncode == 0, show.stderr
        assert sorted((r["partition"], r["offset"]) for r in json.loads(show.stdout)) == [
            (p, 5) for p in range(8)
        ]
    reset = _cli(
        pooled_database_url,
        kafka,
        "offsets",
        "reset",
        *common,
        "--to-latest",
        "--reason",
        "pgbouncer",
        "--force",
    )
    assert reset.returncode == 0, reset.stderr
    assert stored_offsets(engine, pooled, job_name) == {(topic, p): 10 for p in range(8)}
    lag = _cli(pooled_database_url, kafka, "offsets", "lag", *common, "--format", "json", "--fail-over", "0")
    assert lag.returncode == 0, lag.stderr
    assert '"lag": 0' in lag.stdout.replace('"lag":0', '"lag": 0')


def test_serve_answers_offsets(
    pooled_database_url: str,
    engine: sa.Engine,
    pooled: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topic = topic_factory(partitions=4)
    produce_keyed(kafka, topic, 40, 4, keys=5)
    _seeded(engine, pooled, job_name, topic, 4)
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": pooled_database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
    }
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", pooled.schema, "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", proc.stdout.readline())
        assert match, proc.stderr.read() if proc.stderr else ""
        with httpx.Client(timeout=20) as client:
            for _ in range(8):  # more than psycopg's prepare threshold (5) on each connection
                body = client.get(f"{match.group(1)}/offsets/{job_name}")
                assert body.status_code == 200, body.text
                partitions = body.json()["partitions"]
                assert [(p["partition"], p["offset"], p["lag"]) for p in partitions] == [
                    (p, 5, 5) for p in range(4)
                ]
                assert client.get(f"{match.group(1)}/metrics").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_a_frozen_claim_holder_costs_lock_timeout_not_forever(
    engine: sa.Engine, pooled: DatabaseSettings, job_name: str
) -> None:
    pooled_engine = engine_for(pooled)
    try:
        run = start_run(Store(pooled_engine, pooled), job_name)
        seed(pooled_engine, pooled, job_name, {("t", 0): 0})
        outcome: list[object] = []

        def claim() -> None:
            started = time.monotonic()
            try:
                commit_ranges(Store(pooled_engine, pooled), run, [OffsetRange("t", 0, 0, 5)])
                outcome.append("committed")
            except ClaimBlocked as exc:
                outcome.append((exc, time.monotonic() - started))

        with engine.connect() as holder:  # a frozen holder of the row (direct, not through PgBouncer)
            holder.execute(
                sa.text(f'SELECT 1 FROM "{pooled.schema}".offsets WHERE job = :j FOR UPDATE'), {"j": job_name}
            )
            worker = threading.Thread(target=claim, daemon=True)
            worker.start()
            worker.join(8)
            blocked = worker.is_alive()
            holder.rollback()
        worker.join(20)
        assert not blocked, "the claim waited for the holder: lock_timeout did not apply through PgBouncer"
        ((exc, waited),) = outcome  # type: ignore[misc]
        assert isinstance(exc, ClaimBlocked) and waited < 5, outcome
        assert stored_offsets(engine, pooled, job_name) == {("t", 0): 0}
    finally:
        pooled_engine.dispose()


@pytest.fixture(scope="module")
def statement_pooled_url(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with started_pgbouncer(services, tmp_path_factory.mktemp("pgbouncer") / "statement", "statement") as url:
        yield url


def test_statement_pooling_is_refused_with_a_config_error(statement_pooled_url: str, pg_schema: str) -> None:
    db = DatabaseSettings(statement_pooled_url, schema=pg_schema)
    eng = engine_for(db)
    try:
        with pytest.raises(ConfigError, match="statement pooling") as caught, eng.connect():
            pass
        assert "pool_mode = transaction" in str(caught.value)
        assert str(sa.engine.make_url(statement_pooled_url).password) not in str(caught.value)
    finally:
        eng.dispose()
