"""The CLI contract (docs/store.md, "Exit codes"): --version, global flags on either side of the
command, usage errors as one line with exit code 64, every number checked, an unknown job an error
everywhere, the lag threshold's own exit code, and dev commands that create nothing unasked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, seed
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import SchemaMissing
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

USAGE = 64


def test_version(run_cli: Cli) -> None:
    assert run_cli("--version") == (0, f"txn-offsets {version('txn-offsets')}\n", "")


def test_debug_and_verbose_after_the_command(run_cli: Cli, db: DatabaseSettings) -> None:
    s = ["--schema", db.schema]
    code, _, err = run_cli("db", "downgrade", *s, "--debug")  # a usage error stays one line
    assert code == USAGE and err.count("\n") == 1 and "give the revision" in err
    code, _, err = run_cli("db", "check", *s)
    assert code == 1 and err.count("\n") == 1
    with pytest.raises(SchemaMissing):  # --debug: the traceback
        run_cli("db", "check", *s, "--debug")
    with pytest.raises(SchemaMissing):
        run_cli("db", "--debug", "check", *s)
    assert run_cli("db", "current", *s, "-v")[0] == 0
    assert run_cli("db", "current", "--verbose", *s)[0] == 0


def test_verbose_after_the_command_shows_info_logs(database_url: str, db: DatabaseSettings) -> None:
    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": database_url}
    env.pop("TXN_OFFSETS_LOG_FORMAT", None)
    done = subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", "db", "upgrade", "--schema", db.schema, "-v"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "alembic" in done.stderr and "upgraded" in done.stderr


def test_format_before_the_command(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    s = ["--schema", migrated.schema]
    start_run(Store(engine, migrated), job_name)
    code, out, err = run_cli("--format", "json", "jobs", "list", *s)
    assert code == 0, err
    assert [j["job"] for j in json.loads(out)] == [job_name]
    # the command's own --format wins over the global one
    code, out, _ = run_cli("--format", "json", "jobs", "list", "--format", "table", *s)
    assert code == 0 and out.startswith("JOB")
    code, out, err = run_cli("--format", "json", "db", "current", *s)
    assert (code, out) == (USAGE, "")
    assert "--format" in err and "db" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["nope"],
        ["jobs", "list", "--format", "yaml"],
        ["offsets", "show", "--no-such-flag"],
        ["offsets", "reset", "--job", "j"],
    ],
)
def test_usage_errors_are_one_line_and_exit_64(run_cli: Cli, argv: list[str]) -> None:
    code, out, err = run_cli(*argv)
    assert (code, out) == (USAGE, "")
    assert err.startswith("txn-offsets") and "error:" in err and "--help" in err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["offsets", "history", "--job", "J", "--limit", "-1"], "--limit: -1 is below 1"),
        (["offsets", "history", "--job", "J", "--limit", "0"], "--limit: 0 is below 1"),
        (["offsets", "history", "--job", "J", "--limit", "ten"], "--limit: 'ten' is not a whole number"),
        (["offsets", "lag", "--job", "J", "--fail-over", "-1"], "--fail-over: -1 is below 0"),
        (
            ["offsets", "reset", "--job", "J", "--to-offset", "-5", "--reason", "x"],
            "--to-offset: -5 is below 0",
        ),
        (
            ["offsets", "reset", "--job", "J", "--to-offset", str(2**63), "--reason", "x"],
            f"--to-offset: {2**63} is above {2**63 - 1}",
        ),
        (["offsets", "reset", "--job", "J", "--shift-by", "1.5", "--reason", "x"], "not a whole number"),
        (
            ["offsets", "reset", "--job", "J", "--topic", "t", "--partition", "-1", "--to-latest"],
            "--partition: -1 is below 0",
        ),
        (
            ["offsets", "import", "--job", "J", "--from-spark-checkpoint", "d", "--checkpoint-batch", "-2"],
            "--checkpoint-batch: -2 is below 0",
        ),
        (["serve", "--port", "70000"], "--port: 70000 is above 65535"),
        (["serve", "--kafka-cache-s", "-1"], "--kafka-cache-s: '-1' is not a number of seconds >= 0"),
        (["serve", "--kafka-cache-s", "nan"], "--kafka-cache-s: 'nan' is not a number of seconds >= 0"),
        (["serve", "--kafka-cache-s", "inf"], "--kafka-cache-s: 'inf' is not a number of seconds >= 0"),
    ],
)
def test_numbers_are_checked_in_one_line(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, argv: list[str], message: str
) -> None:
    start_run(Store(engine, migrated), "J")
    seed(engine, migrated, "J", {("t", 0): 10})
    code, out, err = run_cli(*argv, "--schema", migrated.schema)
    assert (code, out) == (USAGE, "")
    assert message in err and err.count("\n") == 1, err
    assert offsets_of(engine, migrated, "J") == {("t", 0): 10}


def test_unknown_job_is_an_error_everywhere(run_cli: Cli, migrated: DatabaseSettings) -> None:
    s = ["--schema", migrated.schema]
    for argv in (
        ["offsets", "show", "--job", "ghost"],
        ["offsets", "history", "--job", "ghost"],
        ["offsets", "lag", "--job", "ghost"],
        ["offsets", "reset", "--job", "ghost", "--to-offset", "0", "--reason", "x"],
        ["jobs", "retire", "--job", "ghost", "--reason", "x"],
    ):
        code, out, err = run_cli(*argv, *s)
        assert code == 1, (argv, out, err)
        assert "unknown job 'ghost'" in err and err.count("\n") == 1, (argv, err)


def test_dev_status_of_a_missing_stack_dir_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "stakc"
    for argv in (["-m", "txn_offsets.cli", "dev"], ["-m", "txn_offsets.devstack"]):
        done = subprocess.run(
            [sys.executable, *argv, "status", "--stack-dir", str(typo)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert f"no stack in {typo}" in done.stderr and "does not exist" in done.stderr
        assert done.stderr.count("\n") == 1
        assert not typo.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    code = subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", "dev", "status", "--stack-dir", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).returncode
    assert code == 1 and list(empty.iterdir()) == []  # no fresh passwords written
