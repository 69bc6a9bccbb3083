"""`txn-offsets serve` against real PostgreSQL and Kafka: /metrics parsed with prometheus-client's own
parser and checked against the table and the broker, the Kafka cache, the token, the probes, bad
input, and a scrape that never waits for the locks jobs hold."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx2 as httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.integration.helpers import produce_counts, seed
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.redaction import Secret
from txn_offsets.service.app import Service, create_app
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.store import migrate, stats
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run
from txn_offsets.store.schema import tables_for

TOKEN = "s3cret-token-0123456789abcdef"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: TestClient, **headers: str) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def make_client(
    engine: sa.Engine, migrated: DatabaseSettings, kafka_bootstrap: str
) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(
        *, ttl_s: float = 30.0, token: str | None = None, db: DatabaseSettings | None = None
    ) -> TestClient:
        settings = db or migrated
        view = KafkaView(KafkaSettings(kafka_bootstrap), ttl_s=ttl_s)
        service = Service(
            Store(sa.create_engine(settings.url, pool_pre_ping=True), settings),
            view,
            Secret(token) if token else None,
        )
        client = TestClient(create_app(service))
        client.service = service  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()
        c.service.close()  # type: ignore[attr-defined]
        c.service.store.engine.dispose()  # type: ignore[attr-defined]


def probe_when_checked(client: TestClient, path: str) -> tuple[int, dict[str, object]]:
    """The probe's answer once both background checks have run (bounded)."""
    deadline = time.monotonic() + 15
    while not client.service.health.checked():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the health checks did not run"
        time.sleep(0.05)
    response = client.get(path)
    return response.status_code, response.json()


@pytest.fixture
def seeded(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> tuple[str, Run]:
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 5, 1: 3})
    run = start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 2, (topic, 1): 3})
    return topic, run


def test_metrics_match_the_table_and_the_broker(
    make_client: Callable[..., TestClient],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    seeded: tuple[str, Run],
    job_name: str,
    kafka_bootstrap: str,
) -> None:
    topic, run = seeded
    assert stats.record_batch(store, job_name, 1.5, {"committed": 2, "already_committed": 1})
    assert stats.record_batch(store, job_name, 0.05, {"committed": 1})
    assert stats.record_failure(store, job_name, "conflict")
    s = scrape(make_client())

    ends = settled_ends(kafka_bootstrap, topic, 2)  # the read_committed ends, all produced readable
    starts = {tp: lo for tp, (lo, _) in watermarks(KafkaSettings(kafka_bootstrap), list(ends)).items()}
    for part, stored in ((0, 2), (1, 3)):
        group = {"consumergroup": job_name, "topic": topic, "partition": str(part)}
        ours = {"txn_job": job_name, "topic": topic, "partition": str(part)}
        lo, hi = starts[(topic, part)], ends[(topic, part)]
        assert value(s, "kafka_consumergroup_current_offset", **group) == stored
        assert value(s, "kafka_consumergroup_lag", **group) == hi - stored
        assert value(s, "kafka_topic_partition_current_offset", topic=topic, partition=str(part)) == hi
        assert value(s, "kafka_topic_partition_oldest_offset", topic=topic, partition=str(part)) == lo
        assert value(s, "txn_offsets_stored_offset", **ours) == stored
        assert value(s, "txn_offsets_end_offset", **ours) == hi
        assert value(s, "txn_offsets_log_start_offset", **ours) == lo
        assert value(s, "txn_offsets_lag_records", **ours) == hi - stored
        assert 0 <= value(s, "txn_offsets_last_commit_age_seconds", **ours) < 60
    assert value(s, "kafka_consumergroup_lag_sum", consumergroup=job_name, topic=topic) == 3
    p0 = {"txn_job": job_name, "topic": topic, "partition": "0"}
    assert 0 <= value(s, "txn_offsets_lag_seconds", **p0) < 120  # records produced just now
    assert value(s, "txn_offsets_lag_seconds", txn_job=job_name, topic=topic, partition="1") == 0
    assert value(s, "txn_offsets_job_generation", txn_job=job_name) == run.generation
    assert value(s, "txn_offsets_job_live", txn_job=job_name) == 1
    # the histogram: 0.05 s in the first bucket, 1.5 s in le=2.5
    assert value(s, "txn_offsets_batch_duration_seconds_count", txn_job=job_name) == 2
    assert value(s, "txn_offsets_batch_duration_seconds_sum", txn_job=job_name) == pytest.approx(1.55)
    assert value(s, "txn_offsets_batch_duration_seconds_bucket", txn_job=job_name, le="0.1") == 1
    assert value(s, "txn_offsets_batch_duration_seconds_bucket", txn_job=job_name, le="1.0") == 1
    assert value(s, "txn_offsets_batch_duration_seconds_bucket", txn_job=job_name, le="2.5") == 2
    assert value(s, "txn_offsets_batch_duration_seconds_bucket", txn_job=job_name, le="+Inf") == 2
    outcome = "txn_offsets_batch_outcomes_total"
    assert value(s, outcome, txn_job=job_name, outcome="committed") == 3
    assert value(s, outcome, txn_job=job_name, outcome="already_committed") == 1
    assert value(s, outcome, txn_job=job_name, outcome="conflict") == 1
    assert value(s, outcome, txn_job=job_name, outcome="fenced") == 0
    assert value(s, "txn_offsets_up", target="database") == 1
    assert value(s, "txn_offsets_up", target="kafka") == 1


def test_kafka_queries_are_cached_across_scrapers(
    make_client: Callable[..., TestClient], seeded: tuple[str, Run]
) -> None:
    client = make_client(ttl_s=30.0)
    threads = [threading.Thread(target=scrape, args=(client,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    scrape(client)
    client.get("/offsets")
    assert client.service.kafka.refreshes == 1  # type: ignore[attr-defined]
    uncached = make_client(ttl_s=0.0)
    scrape(uncached)
    scrape(uncached)
    assert uncached.service.kafka.refreshes == 2  # type: ignore[attr-defined]


def test_offsets_json(make_client: Callable[..., TestClient], seeded: tuple[str, Run], job_name: str) -> None:
    topic, run = seeded
    client = make_client()
    body = client.get("/offsets").json()
    (job,) = body["jobs"]
    assert (job["job"], job["generation"], job["state"], job["total_lag"]) == (
        job_name,
        run.generation,
        "live",
        3,
    )
    assert [(p["topic"], p["partition"], p["offset"], p["lag"]) for p in job["partitions"]] == [
        (topic, 0, 2, 3),
        (topic, 1, 3, 0),
    ]
    one = client.get(f"/offsets/{job_name}")
    assert one.status_code == 200 and one.json()["job"] == job_name
    missing = client.get("/offsets/ghost")
    assert missing.status_code == 404 and missing.json() == {
        "error": "unknown job 'ghost' (see /offsets for the jobs of this store)"
    }
    bad = client.get("/offsets/%01")
    assert bad.status_code == 400 and "job" in bad.json()["error"]


def test_bearer_token(
    make_client: Callable[..., TestClient], seeded: tuple[str, Run], caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(token=TOKEN)
    for path in ("/metrics", "/offsets"):
        assert client.get(path).status_code == 401
        denied = client.get(path, headers={"Authorization": "Bearer wrong"})
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in denied.text
    assert scrape(client, Authorization=f"Bearer {TOKEN}")
    # the probes stay open, without details; the token adds them
    assert probe_when_checked(client, "/healthz") == (200, {"status": "ok", "postgres": "ok", "kafka": "ok"})
    detailed = client.get("/readyz", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert detailed["status"] == "ok" and detailed["details"]["postgres"]["revision"] == migrate.head()
    assert TOKEN not in caplog.text


def test_probes(
    make_client: Callable[..., TestClient], engine: sa.Engine, migrated: DatabaseSettings
) -> None:
    client = make_client()
    both_ok = {"status": "ok", "postgres": "ok", "kafka": "ok"}
    assert probe_when_checked(client, "/healthz") == (200, both_ok)
    assert probe_when_checked(client, "/readyz") == (200, {**both_ok, "schema": "ok"})
    migrate.downgrade(migrated, "0003")
    time.sleep(client.service.health.interval_s + 0.5)  # type: ignore[attr-defined]
    assert probe_when_checked(client, "/readyz") == (
        503,
        {"status": "unavailable", "postgres": "ok", "kafka": "ok", "schema": "mismatch"},
    )
    assert probe_when_checked(client, "/healthz") == (200, both_ok)  # alive all the same


def test_unreachable_database_is_reported_without_the_password(
    make_client: Callable[..., TestClient], migrated: DatabaseSettings
) -> None:
    dead = DatabaseSettings(
        Secret("postgresql+psycopg://u:pw-secret-9@127.0.0.1:1/db"), schema=migrated.schema
    )
    client = make_client(db=dead, token=TOKEN)
    assert probe_when_checked(client, "/readyz") == (
        503,
        {"status": "unavailable", "postgres": "unavailable", "kafka": "ok", "schema": "unavailable"},
    )
    health = client.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    assert health.json()["details"]["postgres"]["url"] == "postgresql+psycopg://u:***@127.0.0.1:1/db"
    assert health.json()["details"]["postgres"]["error"] == "ServiceUnavailable"
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert metrics.status_code == 200 and "pw-secret-9" not in metrics.text + health.text
    s = scrape(client, Authorization=f"Bearer {TOKEN}")
    assert value(s, "txn_offsets_up", target="database") == 0
    assert client.get("/offsets", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503


def test_scrapes_never_wait_for_the_locks_jobs_hold(
    make_client: Callable[..., TestClient],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    seeded: tuple[str, Run],
    job_name: str,
) -> None:
    """A new run or a reset holds the job row FOR UPDATE, a claim holds offset rows: a scrape
    meanwhile answers at once (plain SELECTs take no row locks)."""
    t = tables_for(migrated.schema)
    client = make_client()
    with engine.connect() as holder, holder.begin():
        holder.execute(sa.select(t.jobs).where(t.jobs.c.job == job_name).with_for_update()).all()
        holder.execute(sa.select(t.offsets).where(t.offsets.c.job == job_name).with_for_update()).all()
        holder.execute(sa.select(t.stats)).all()
        started = time.monotonic()
        s = scrape(client)
        assert time.monotonic() - started < 5
        assert value(s, "txn_offsets_job_generation", txn_job=job_name) >= 1


def test_stats_are_best_effort(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    job_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ValueError, match="use one of"):
        stats.record_failure(store, job_name, "exploded")
    with pytest.raises(ValueError, match="finite number"):
        stats.record_batch(store, job_name, float("nan"), {})
    migrate.downgrade(migrated, "0003")  # no job_stats table: the job must not notice
    assert stats.record_batch(store, job_name, 1.0, {"committed": 1}) is False
    assert "batch statistics not recorded" in caplog.text


def test_serve_command_binds_loopback_and_stops_on_sigterm(
    database_url: str, kafka_bootstrap: str, migrated: DatabaseSettings
) -> None:
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", migrated.schema, "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
        assert match, line
        deadline = time.monotonic() + 15
        while (ready := httpx.get(f"{match.group(1)}/readyz", timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.1)
        assert ready.json() == {"status": "ok", "postgres": "ok", "kafka": "ok", "schema": "ok"}
        families = {
            f.name
            for f in text_string_to_metric_families(httpx.get(f"{match.group(1)}/metrics", timeout=30).text)
        }
        assert {"txn_offsets_up", "kafka_consumergroup_lag", "txn_offsets_batch_duration_seconds"} <= families
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err

    # a port that is taken, a token too short to be one: one line, exit 1, nothing served
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = str(blocker.getsockname()[1])
        busy = subprocess.run(
            [*cmd[:-1], port], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    assert busy.returncode == 1 and busy.stderr.startswith(
        "txn-offsets: error: --port: cannot listen on 127.0.0.1:"
    )
    assert busy.stderr.count("\n") == 1
    short = subprocess.run(
        cmd,
        env={**env, "TXN_OFFSETS_SERVE_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert short.returncode == 1 and "TXN_OFFSETS_SERVE_TOKEN: is shorter than 16 characters" in short.stderr
