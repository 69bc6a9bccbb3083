"""A Kafka outage is one clear line, soon (issue 23, part 2): the CLI run as a process against a
closed loopback port and against a listener that accepts connections and never answers prints a
few lines at most on stderr (librdkafka's own log goes through Python logging, de-duplicated),
one of them naming the bootstrap servers, exits 1 and takes seconds, not the 11-13 s of the
request timeouts; `serve` with Kafka down logs rate-limited lines over several scrapes, naming the
cause (issue 44: librdkafka's own lines at INFO only)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2 as httpx
import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of, seed
from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

BOUND_S = 8.0  # python start + database + the first-contact bound, with room for a busy machine


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A listener whose connections complete (the kernel accepts them) and never get an answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def cli(database_url: str, *argv: str) -> tuple[int, str, str, float]:
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    env.pop("TXN_OFFSETS_KAFKA_BOOTSTRAP", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", *argv],
        check=False,
        env=env,
        capture_output=True,
        timeout=60,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode(), time.monotonic() - started


@pytest.mark.parametrize("kafka", ["closed_port", "silent_listener"])
def test_cli_fails_fast_with_one_clear_line(
    request: pytest.FixtureRequest,
    kafka: str,
    database_url: str,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
) -> None:
    bootstrap: str = request.getfixturevalue(kafka)
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t-outage", 0): 3})
    common = ["--job", job_name, "--schema", migrated.schema, "--kafka-bootstrap", bootstrap]
    commands = [
        ["offsets", "lag", *common],
        ["offsets", "reset", *common, "--to-offset", "1", "--reason", "x"],
    ]
    if kafka == "closed_port":  # the other commands' first Kafka calls (a few seconds each)
        commands.append(["offsets", "import", *common, "--from-consumer-group", "g-outage"])
    for argv in commands:
        code, out, err, took = cli(database_url, *argv)
        lines = [ln for ln in err.splitlines() if not ln.startswith("import: ")]  # import's progress
        assert code == 1, (argv, out, err)
        assert took < BOUND_S, (argv, took, err)
        assert 1 <= len(lines) <= 3, (argv, err)
        assert lines[-1].startswith("txn-offsets: error: ") and bootstrap in lines[-1], (argv, err)
        assert not any(ln.startswith("%") for ln in lines), err  # no raw librdkafka log lines
    assert offsets_of(engine, migrated, job_name) == {("t-outage", 0): 3}  # nothing moved


def test_serve_logs_a_kafka_outage_rate_limited(
    database_url: str, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, closed_port: str
) -> None:
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t-outage", 0): 3})
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url, "TXN_OFFSETS_KAFKA_BOOTSTRAP": closed_port}
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--port", "0", "--schema", migrated.schema]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", proc.stdout.readline())
        assert match, proc.stdout
        scrapes = 0
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                response = client.get(f"{match.group(1)}/metrics")
                assert response.status_code == 200
                assert 'txn_offsets_up{target="kafka"} 0.0' in response.text or scrapes < 2
                scrapes += 1
                time.sleep(1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    lines = err.splitlines()
    raw = [ln for ln in lines if ln.startswith("%")]
    assert raw == [], raw[:3]  # librdkafka's own stderr lines: all through logging
    fails = [ln for ln in lines if f"connection refused by {closed_port}" in ln]
    assert 1 <= len(fails) <= 3, err  # the cause, named by our own lines, not once per reconnect
    assert not any("librdkafka" in ln for ln in lines), err  # its lines only at INFO (-v)
    assert len(lines) <= scrapes + 6, err
