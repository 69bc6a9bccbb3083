"""A Kafka that cannot be talked to says why in the CLI's one line (issue 44, item 7): a closed port,
a host name that does not resolve, a PLAINTEXT listener reached with SSL, the stack's TLS listener
reached as PLAINTEXT and a wrong SASL password each end in exactly one stderr line naming
librdkafka's cause (before: "no answer in 4s" for all of them, under a librdkafka WARNING line),
exit 1, no librdkafka line, no password."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fix_services import run_module
from tests.integration.helpers import seed
from tests.integration.test_tls_sasl import Tls, tls  # noqa: F401 - the stack's TLS endpoints
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka import admins
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

WRONG_PASSWORD = "wr0ng-pass-7f3a"
Lag = Callable[..., tuple[int, list[str], str]]


@pytest.fixture
def lag(
    database_url: str, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, tmp_path: Path
) -> Lag:
    """`txn-offsets offsets lag` of a seeded job against a Kafka at `bootstrap` with the properties
    `props`: (exit code, stderr lines)."""
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t-causes", 0): 3})

    def run(bootstrap: str, props: str = "") -> tuple[int, list[str], str]:
        argv = [
            "offsets",
            "lag",
            "--job",
            job_name,
            "--schema",
            migrated.schema,
            "--kafka-bootstrap",
            bootstrap,
        ]
        if props:
            config = tmp_path / "kafka.properties"
            config.write_text(props)
            argv += ["--kafka-config", str(config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXN_OFFSETS_KAFKA")}
        env["TXN_OFFSETS_DATABASE_URL"] = database_url
        done = run_module("txn_offsets.cli", *argv, env=env, timeout=60)
        return done.returncode, done.stderr.splitlines(), done.stdout

    return run


def _one_line(result: tuple[int, list[str], str], *phrases: str) -> str:
    code, lines, out = result
    assert code == 1, (code, lines, out)
    assert len(lines) == 1, lines  # no librdkafka WARNING/ERROR line above the error
    (line,) = lines
    assert line.startswith("txn-offsets: error: "), line
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    assert "no answer in" not in line, line
    return line


def test_a_closed_port_is_connection_refused(lag: Lag) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    _one_line(lag(closed), f"cannot reach Kafka at {closed}: connection refused by {closed}")


def test_a_host_that_does_not_resolve_is_named(lag: Lag) -> None:
    # over SSL: no warning about a non-loopback broker without TLS, only the error
    line = _one_line(lag("no-such-host.invalid:9092", "security.protocol=SSL\n"))
    assert "name resolution failed for host 'no-such-host.invalid'" in line, line


def test_ssl_against_a_plaintext_listener_says_so(lag: Lag, kafka_bootstrap: str) -> None:
    line = _one_line(lag(kafka_bootstrap, "security.protocol=SSL\n"))
    assert f"SSL handshake with {kafka_bootstrap} failed: it is a PLAINTEXT listener" in line, line
    assert "security.protocol=SSL" in line, line


def test_plaintext_against_the_tls_listener_says_wrong_protocol(lag: Lag, tls: Tls) -> None:  # noqa: F811
    bootstrap = tls.kafka.bootstrap_servers
    line = _one_line(lag(bootstrap))
    assert f"{bootstrap} closed the connection without answering: wrong protocol?" in line, line
    assert "security.protocol=PLAINTEXT; a TLS listener needs SSL or SASL_SSL" in line, line


def test_a_wrong_sasl_password_is_named_without_it(lag: Lag, tls: Tls) -> None:  # noqa: F811
    props = re.sub(
        r"(?m)^sasl\.password\s*[=:].*$", f"sasl.password={WRONG_PASSWORD}", tls.kafka_config.read_text()
    )
    result = lag(tls.kafka.bootstrap_servers, props)
    line = _one_line(
        result, "sasl.username/sasl.password: ", "refused the SCRAM-SHA-512 login of user 'txn_offsets'"
    )
    assert "SASL authentication error" in line and "(after " not in line, line
    assert WRONG_PASSWORD not in line + result[2] and tls.password not in line, line


def test_a_refusal_ends_the_first_contact_early_silence_does_not() -> None:
    """Once every bootstrap server has said why for a second, the 4 s bound is not waited out;
    a listener that never answers still is ("no answer in 4s": librdkafka says nothing)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=f"connection refused by {closed}"):
        admins.connected_admin(KafkaSettings(closed), timeout_s=10)
    assert admins.SETTLED_S <= time.monotonic() - started < admins.FIRST_CONTACT_S

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        quiet = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match=rf"cannot reach Kafka at {quiet}: no answer in 4s"):
            admins.connected_admin(KafkaSettings(quiet), timeout_s=10)
        assert time.monotonic() - started >= admins.FIRST_CONTACT_S
