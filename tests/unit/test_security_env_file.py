"""Issue 42, item 10: the local stack's env file quotes its values, so that sourcing it as the docs
and the Makefile do (``set -a; . .stack/env; set +a``, in bash and in make's /bin/sh) gives every
value exactly as written: the ``&`` of TXN_OFFSETS_TLS_DATABASE_URL no longer splits its line,
nothing in a value is run. ``Stack.env()`` (the tests' reader) reads it the same way.

The writer runs on a temporary directory; the running stack is left alone."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from txn_offsets.devstack import Stack, postgres
from txn_offsets.devstack.kafka import KafkaNode

SHELLS = [shell for shell in ("bash", "sh") if shutil.which(shell)]


def _sourced(path: Path, shell: str) -> dict[str, str]:
    """The environment `shell` exports after ``set -a; . path; set +a`` (as the Makefile does)."""
    done = subprocess.run(
        [shell, "-c", 'set -a; . "$1"; set +a; env -0', "sourcing", str(path)],
        env={"PATH": os.environ["PATH"]},
        cwd=path.parent,
        capture_output=True,
        check=True,
        timeout=30,
    )
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k.startswith("TXN_OFFSETS_")}


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    # a stack directory whose path a shell would split or expand if it were not quoted
    return Stack(tmp_path / "my stack's $HOME & `x`")


def _written(stack: Stack, password: str) -> dict[str, str]:
    """What up() writes for a stack with TLS on (no PgBouncer, no replica running), and what each
    value must be."""
    stack.dir.mkdir(parents=True)
    state: dict[str, object] = {
        "pg_port": 45432,
        "kafka_port": 49092,
        "kafka_controller_port": 49093,
        "kafka_sasl_port": 49094,
        "pg_app_password": password,
        "pg_run_password": f"run-{password}",
        "pg_admin_password": "admin-pw",
        "kafka_scram_password": "scram-pw",
    }
    node = KafkaNode(home=stack.dir / "kafka", libs=stack.dir / "libs", port=49092, controller_port=49093)
    cluster = SimpleNamespace(port=45432)  # _write_env reads only its port
    stack._write_env(state, cluster, node)  # type: ignore[arg-type]
    app = f"postgresql+psycopg://{postgres.APP_USER}:{password}@127.0.0.1:45432/{postgres.APP_DB}"
    run = f"postgresql+psycopg://{postgres.RUN_USER}:run-{password}@127.0.0.1:45432/{postgres.APP_DB}"
    admin = f"postgresql+psycopg://{postgres.ADMIN_USER}:admin-pw@127.0.0.1:45432/{postgres.APP_DB}"
    tls = stack.dir / "tls"
    return {
        "TXN_OFFSETS_DATABASE_URL": run,
        "TXN_OFFSETS_OWNER_DATABASE_URL": app,
        "TXN_OFFSETS_ADMIN_DATABASE_URL": admin,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": "127.0.0.1:49092",
        "TXN_OFFSETS_STACK_DIR": str(stack.dir),
        "TXN_OFFSETS_TLS_DATABASE_URL": f"{app}?sslmode=verify-full&sslrootcert={tls / 'ca.pem'}",
        "TXN_OFFSETS_TLS_KAFKA_BOOTSTRAP": "127.0.0.1:49094",
        "TXN_OFFSETS_TLS_KAFKA_CONFIG": str(tls / "kafka-client.properties"),
        "TXN_OFFSETS_TLS_CA": str(tls / "ca.pem"),
    }


@pytest.mark.parametrize("shell", SHELLS)
def test_sourcing_the_env_file_gives_every_value_exactly(stack: Stack, shell: str) -> None:
    expected = _written(stack, "pw-Ab12_x")
    assert _sourced(stack.env_file, shell) == expected


@pytest.mark.parametrize("shell", SHELLS)
def test_the_tls_url_survives_sourcing(tmp_path: Path, shell: str) -> None:
    """The issue as found: a plain stack directory, and the TLS URL's '&' split its line."""
    expected = _written(Stack(tmp_path / "stack"), "pw-Ab12_x")
    url = expected["TXN_OFFSETS_TLS_DATABASE_URL"]
    assert "&sslrootcert=" in url
    assert _sourced(tmp_path / "stack" / "env", shell)["TXN_OFFSETS_TLS_DATABASE_URL"] == url


@pytest.mark.parametrize("shell", SHELLS)
def test_nothing_in_a_value_is_run_or_expanded(stack: Stack, shell: str) -> None:
    # not a password up() makes (token_urlsafe), but the file must hold any text
    password = "it's $(touch pwned) `touch pwned2` ; & | \\ \" $HOME *"
    expected = _written(stack, password)
    assert _sourced(stack.env_file, shell) == expected
    assert not (stack.dir / "pwned").exists() and not (stack.dir / "pwned2").exists()


def test_stack_env_reads_the_values_back(stack: Stack) -> None:
    expected = _written(stack, "it's & $x")
    assert stack.env() == expected
    assert stat.S_IMODE(stack.env_file.stat().st_mode) == 0o600


def test_each_line_is_key_equals_single_quoted_value(stack: Stack) -> None:
    _written(stack, "it's")
    lines = stack.env_file.read_text().splitlines()
    assert lines and all(line.split("=", 1)[1].startswith("'") and line.endswith("'") for line in lines)
    assert "TXN_OFFSETS_KAFKA_BOOTSTRAP='127.0.0.1:49092'" in lines
    assert any("it'\\''s@127.0.0.1" in line for line in lines)


def test_a_file_written_before_quoting_still_reads(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    stack.env_file.write_text("TXN_OFFSETS_KAFKA_BOOTSTRAP=127.0.0.1:9092\nOTHER_URL=a?b=1&c=2\n")
    assert stack.env() == {"TXN_OFFSETS_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "OTHER_URL": "a?b=1&c=2"}
