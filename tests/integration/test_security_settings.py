"""Issue 42, items 6, 8 and 9 against the real stack (nothing mocked):

* 6: a role whose password holds an '@': its URL with the '@' as is is refused by the CLI without
  a fragment of the password; written %40 it connects.
* 8: control characters a tenant wrote into a job row and an audit reason are escapes in the
  admin's ``jobs list`` / ``offsets history`` tables; the JSON output gives the values as stored.
* 9: the CLI reaching PostgreSQL and Kafka through a non-loopback address of this machine (a TCP
  relay to the stack, which listens on loopback only) without verified TLS warns once per
  service; ``TXN_OFFSETS_REQUIRE_TLS=1`` refuses before connecting; PostgreSQL with a verified
  certificate (``sslmode=verify-ca``, the stack's CA) over the same address is quiet and allowed.

Item 10 (the env file) is tests/unit/test_security_env_file.py: the running stack's file is not
rewritten by a test.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from psycopg import sql

from tests.integration.helpers import produce_counts, seed
from txn_offsets import cli
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def migrated(database_url: str, pg_schema: str) -> DatabaseSettings:
    db = DatabaseSettings(Secret(database_url), schema=pg_schema)
    assert migrate.upgrade(db) == migrate.head()
    return db


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, *argv: str):  # type: ignore[no-untyped-def]
    """cli.main in this process with `url` as TXN_OFFSETS_DATABASE_URL: (exit code, stdout, stderr)."""
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", url)
    monkeypatch.delenv("TXN_OFFSETS_SCHEMA", raising=False)
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- item 6: '@' in the password


@pytest.fixture
def at_role(admin_database_url: str) -> Iterator[tuple[str, str]]:
    """A login role whose password holds an '@': (name, password); dropped afterwards."""
    name, password = f"t_at_{uuid.uuid4().hex[:10]}", f"pw@frag-{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(admin_database_url, poolclass=sa.pool.NullPool)
    statement = sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
        sql.Identifier(name), sql.Literal(password)
    )
    with admin.begin() as conn:
        conn.exec_driver_sql(statement.as_string())
    try:
        yield name, password
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)).as_string())
        admin.dispose()


def test_an_unencoded_at_in_the_password_is_refused_without_a_fragment(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    at_role: tuple[str, str],
) -> None:
    name, password = at_role
    real = sa.engine.make_url(database_url)
    where = f"{real.host}:{real.port}/{real.database}"
    fragment = password.split("@", 1)[1]

    code, out, err = _cli(
        monkeypatch, capsys, f"postgresql+psycopg://{name}:{password}@{where}", "jobs", "list"
    )
    assert code == 1, (out, err)
    (line,) = err.splitlines()
    assert line.startswith(f"txn-offsets: error: database_url: postgresql+psycopg://{name}:***@{where} ")
    assert "%40" in line
    assert fragment not in err + out and password not in err + out

    # written as the message says, the same password connects
    encoded = DatabaseSettings(Secret(f"postgresql+psycopg://{name}:{password.replace('@', '%40')}@{where}"))
    engine = engine_for(encoded)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_user")).scalar_one() == name
    finally:
        engine.dispose()


# -- item 8: control characters in table output

EVIL_JOB = "evil\x1b[31m\nFAKE-JOB 0 idle"
EVIL_RUN = "run\x1b]0;pwned\x07"
EVIL_REASON = "because\x1b[2J\x1b[H\nAT 2020-01-01 FORGED"
EVIL_ACTOR = "mallory\r\x08\x08admin"


def test_tables_escape_control_characters_json_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engine: sa.Engine,
    database_url: str,
    migrated: DatabaseSettings,
    job_name: str,
) -> None:
    schema = migrated.schema  # a validated identifier
    with engine.begin() as conn:  # what a tenant can write with SQL into rows of its own job
        conn.execute(
            sa.text(
                f'INSERT INTO "{schema}".jobs (job, generation, run_id) VALUES (:j, 0, :r), (:n, 0, NULL)'
            ),
            {"j": EVIL_JOB, "r": EVIL_RUN, "n": job_name},
        )
        conn.execute(
            sa.text(
                f'INSERT INTO "{schema}".offset_audit '
                "(job, topic, part, old_off, new_off, action, reason, actor) "
                "VALUES (:n, 't', 0, 1, 2, 'reset', :reason, :actor)"
            ),
            {"n": job_name, "reason": EVIL_REASON, "actor": EVIL_ACTOR},
        )
    s = ["--schema", migrated.schema]

    code, out, err = _cli(monkeypatch, capsys, database_url, "jobs", "list", *s)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3, lines  # header + two jobs: the newline forged no row
    assert "evil\\x1b[31m\\nFAKE-JOB 0 idle" in out and "run\\x1b]0;pwned\\x07" in out
    assert "\x1b" not in out and "\x07" not in out

    code, out, err = _cli(monkeypatch, capsys, database_url, "offsets", "history", "--job", job_name, *s)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2, lines
    assert "mallory\\r\\x08\\x08admin" in lines[1]
    assert lines[1].endswith("because\\x1b[2J\\x1b[H\\nAT 2020-01-01 FORGED")
    assert not [c for c in out.replace("\n", "") if ord(c) < 0x20]

    code, out, _ = _cli(monkeypatch, capsys, database_url, "jobs", "list", *s, "--format", "json")
    assert code == 0
    assert {(j["job"], j["run_id"]) for j in json.loads(out)} == {(EVIL_JOB, EVIL_RUN), (job_name, None)}
    code, out, _ = _cli(
        monkeypatch, capsys, database_url, "offsets", "history", "--job", job_name, *s, "--format", "json"
    )
    assert code == 0
    ((row),) = json.loads(out)
    assert (row["reason"], row["actor"]) == (EVIL_REASON, EVIL_ACTOR)


# -- item 9: verified TLS beyond loopback


def _non_loopback_address() -> str:
    """An IPv4 address of this machine other than loopback (a UDP connect sends nothing)."""
    for probe in ("192.0.2.1", "10.255.255.255", "198.51.100.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
            s.connect((probe, 9))
            address = str(s.getsockname()[0])
            if not ipaddress.ip_address(address).is_loopback:
                return address
    pytest.fail("this machine has no non-loopback IPv4 address to reach the stack through")


class Relay:
    """Accepts on `address` (port chosen), pipes each connection to 127.0.0.1:`port`, counts them."""

    def __init__(self, address: str, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.server = socket.create_server((address, 0))
        self.host, self.port = address, self.server.getsockname()[1]
        self.accepted = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def relay() -> Iterator[Callable[[int], Relay]]:
    address = _non_loopback_address()
    made: list[Relay] = []

    def make(port: int) -> Relay:
        made.append(Relay(address, port))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (the warning is once per process)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TXN_OFFSETS_REQUIRE_TLS", "TXN_OFFSETS_KAFKA_CONFIG")
    }
    base.pop("PGSSLMODE", None)
    return subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", *argv],
        env={**base, **env},
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _security_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "txn_offsets.security" in line]


def test_no_verified_tls_beyond_loopback_warns_once_per_service_or_is_refused(
    engine: sa.Engine,
    database_url: str,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    relay: Callable[[int], Relay],
) -> None:
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 3, 1: 2})
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 1, (topic, 1): 0})
    real = sa.engine.make_url(database_url)
    password = str(real.password)
    pg = relay(int(real.port or 5432))
    kafka = relay(int(kafka_bootstrap.rsplit(":", 1)[1]))
    remote_url = real.set(host=pg.host, port=pg.port).render_as_string(hide_password=False)
    lag = ["offsets", "lag", "--job", job_name, "--schema", migrated.schema]
    remote_kafka = ["--kafka-bootstrap", f"{kafka.host}:{kafka.port}"]

    # plain TCP to both, over a non-loopback address: it works, with one warning for each service
    done = _run({"TXN_OFFSETS_DATABASE_URL": remote_url}, *lag, *remote_kafka)
    assert done.returncode == 0, done.stderr
    assert topic in done.stdout
    assert pg.accepted >= 1 and kafka.accepted >= 1  # it really went through that address
    pg_warning, kafka_warning = _security_lines(done.stderr)
    assert f"PostgreSQL at {pg.host} is reached without verified TLS (no sslmode" in pg_warning
    assert "sslmode=verify-full" in pg_warning and "TXN_OFFSETS_REQUIRE_TLS=1" in pg_warning
    assert f"Kafka at {kafka.host}:{kafka.port} is reached without verified TLS" in kafka_warning
    assert "security.protocol=PLAINTEXT" in kafka_warning and "security.protocol=SASL_SSL" in kafka_warning
    assert password not in done.stderr + done.stdout

    # TXN_OFFSETS_REQUIRE_TLS=1: refused before anything connects, naming the setting
    before = pg.accepted, kafka.accepted
    done = _run({"TXN_OFFSETS_DATABASE_URL": remote_url, "TXN_OFFSETS_REQUIRE_TLS": "1"}, *lag, *remote_kafka)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"txn-offsets: error: sslmode: PostgreSQL at {pg.host} is reached without verified TLS"
    )
    assert line.endswith("refused by TXN_OFFSETS_REQUIRE_TLS=1") and password not in line
    done = _run(
        {"TXN_OFFSETS_DATABASE_URL": database_url, "TXN_OFFSETS_REQUIRE_TLS": "1"}, *lag, *remote_kafka
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"txn-offsets: error: security.protocol: Kafka at {kafka.host}:{kafka.port} is reached "
        "without verified TLS"
    )
    assert (pg.accepted, kafka.accepted) == before

    # loopback, as the local stack and the tests run: quiet, even with TLS required
    done = _run({"TXN_OFFSETS_DATABASE_URL": database_url, "TXN_OFFSETS_REQUIRE_TLS": "1"}, *lag)
    assert done.returncode == 0, done.stderr
    assert _security_lines(done.stderr) == []


@pytest.fixture(scope="module")
def tls_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stack's TLS URL (make stack-up TLS=1), else that of a TLS stack started for the module."""
    from txn_offsets.devstack import Stack

    url = os.environ.get("TXN_OFFSETS_TLS_DATABASE_URL")
    if not url and os.environ.get("TXN_OFFSETS_STACK_DIR"):
        # an env file written before its values were quoted lost this one when sourced ('&')
        url = Stack(Path(os.environ["TXN_OFFSETS_STACK_DIR"])).env().get("TXN_OFFSETS_TLS_DATABASE_URL")
    if url:
        yield url
        return

    stack = Stack(tmp_path_factory.mktemp("tls-stack"))
    try:
        stack.up(tls_on=True)
        yield stack.env()["TXN_OFFSETS_TLS_DATABASE_URL"]
    finally:
        stack.down()
        data = stack._pg(stack._state()).data_dir.parent
        if data.is_relative_to("/var/lib/txn-offsets"):
            shutil.rmtree(data.parent, ignore_errors=True)


def test_verified_tls_beyond_loopback_is_quiet_and_allowed(
    tls_database_url: str, relay: Callable[[int], Relay], pg_schema: str
) -> None:
    real = sa.engine.make_url(tls_database_url)
    pg = relay(int(real.port or 5432))
    # the stack's certificate names 127.0.0.1, not this address: verify-ca checks the chain only
    url = real.set(host=pg.host, port=pg.port).update_query_dict({"sslmode": "verify-ca"})
    db = DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=pg_schema)
    assert migrate.upgrade(db) == migrate.head()  # the schema (pg_schema drops it afterwards)
    before = pg.accepted
    done = _run(
        {
            "TXN_OFFSETS_DATABASE_URL": url.render_as_string(hide_password=False),
            "TXN_OFFSETS_REQUIRE_TLS": "1",
        },
        "jobs",
        "list",
        "--schema",
        pg_schema,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["JOB", "GENERATION", "STATE", "RUN", "HEARTBEAT_AGE_S", "PARTITIONS"]
    assert _security_lines(done.stderr) == []
    assert pg.accepted > before  # the CLI's connection went through that address
