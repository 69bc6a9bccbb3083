"""Every command of `txn-offsets` with a bad input: one line on stderr naming what to fix, no
traceback, nothing on stdout, and the exit code docs/store.md documents ("Exit codes": 64 for a
wrong command line, 1 for a command that ran and failed) - through the installed entry point, as
a subprocess, against the real PostgreSQL and Kafka. The table must cover every command the
parser has: a command added without a row fails `test_the_table_covers_every_command`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.fix_services import Services
from tests.integration.helpers import offsets_of, seed
from txn_offsets.cli import build_parser
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

ENTRY = str(Path(sys.executable).with_name("txn-offsets"))
USAGE, ERROR = 64, 1
SECRET = "pw-secret-44"
URL = f"postgresql://u:{SECRET}@db.example:5432/app"
MAX = str(2**63 - 1)
S = "<schema>"  # the module's migrated schema, with job J at t[0] = 10
NONE = "<no schema>"  # a schema nobody created
MISSING_DIR = "<missing dir>"
ME = "<connected role>"


@dataclass(frozen=True)
class Row:
    command: str  # as `txn-offsets --help` names it ("" for the top level)
    argv: tuple[str, ...]
    code: int
    says: str  # what the one line must hold: the argument and what to fix

    def __str__(self) -> str:
        return " ".join(self.argv)[:80]


def row(command: str, argv: str, code: int, says: str) -> Row:
    return Row(command, tuple(argv.split("|")), code, says)


ROWS = [
    # the top level: no command, an unknown one, an option that does not exist (never echoed)
    row("", "nope", USAGE, "argument command: invalid choice: 'nope'"),
    row("", f"--database-url|{URL}|jobs|list", USAGE, "invalid choice: 'postgresql://***'"),
    row(
        "",
        f"jobs|list|--database-url|{URL}",
        USAGE,
        "unrecognized arguments: --database-url and values (not echoed); the database URL is read "
        "from $TXN_OFFSETS_DATABASE_URL only",
    ),
    row("", f"jobs|list|--database-url={URL}", USAGE, "unrecognized arguments: --database-url and values"),
    row("", "--format|json|db|current", USAGE, "--format: `db` prints no rows"),
    # dev (nothing is started or created)
    row("dev up", "dev|up|--pooler|nope", USAGE, "argument --pooler: invalid choice: 'nope'"),
    row("dev down", "dev|down|--pooler|nope", USAGE, "argument --pooler: invalid choice: 'nope'"),
    row("dev status", f"dev|status|--stack-dir|{MISSING_DIR}", ERROR, "no stack in"),
    # db
    row("db upgrade", f"db|upgrade|--role|r|--schema|{S}", USAGE, "argument --role: goes with `db grants`"),
    row(
        "db upgrade",
        f"db|upgrade|nosuchrev|--schema|{S}",
        USAGE,
        "argument revision: 'nosuchrev' names no single revision",
    ),
    row("db downgrade", f"db|downgrade|--schema|{S}", USAGE, "argument revision: give the revision"),
    row("db current", f"db|current|head|--schema|{S}", USAGE, "argument revision: goes with `db upgrade`"),
    row("db check", f"db|check|--schema|{NONE}", ERROR, "missing or out of date"),
    row("db grants", f"db|grants|--schema|{S}", USAGE, "argument --role: name the role the jobs run as"),
    row("db grants", "db|grants|--role|r|--table|a.b.c", USAGE, "argument --table: 'a.b.c'"),
    row(
        "db grants",
        f"db|grants|--role|no_such_role_44|--apply|--schema|{S}",
        ERROR,
        "--role: role 'no_such_role_44' does not exist: create it first",
    ),
    row(
        "db grants",
        f"db|grants|--role|{ME}|--table|app44.no_such_table|--apply|--schema|{S}",
        ERROR,
        "--table: app44.no_such_table: no such table",
    ),
    row("db role", "db|role", USAGE, "argument --role: name the role"),
    row("db role", "db|role|--role|pg_monitor", USAGE, "argument --role: 'pg_monitor' is a predefined"),
    # offsets
    row("offsets show", f"offsets|show|--job|ghost|--schema|{S}", ERROR, "unknown job 'ghost'"),
    row("offsets reset", f"offsets|reset|--job|J|--to-offset|3|--schema|{S}", USAGE, "argument --reason"),
    row(
        "offsets reset",
        f"offsets|reset|--job|J|--to-datetime|yesterday|--reason|r|--schema|{S}",
        USAGE,
        "argument --to-datetime: 'yesterday' is not an ISO 8601 datetime",
    ),
    row(
        "offsets reset",
        f"offsets|reset|--job|J|--to-datetime|2024-01-01T00:00:00|--reason|r|--schema|{S}",
        USAGE,
        "argument --to-datetime: '2024-01-01T00:00:00' has no timezone",
    ),
    row(
        "offsets reset",
        f"offsets|reset|--job|J|--shift-by|{MAX}|--allow-outside-log|--dry-run|--schema|{S}",
        USAGE,
        f"argument --shift-by: t[0] at 10 would move to {2**63 + 9}; offsets are 0..{MAX}",
    ),
    row(
        "offsets reset",
        f"offsets|reset|--job|J|--shift-by|-11|--allow-outside-log|--reason|r|--schema|{S}",
        USAGE,
        "argument --shift-by: t[0] at 10 would move to -1",
    ),
    row(
        "offsets reset",
        f"offsets|reset|--job|J|--partition|0|--to-offset|1|--reason|r|--schema|{S}",
        USAGE,
        "argument --partition: needs --topic",
    ),
    row(
        "offsets lag", f"offsets|lag|--job|J|--fail-over|-1|--schema|{S}", USAGE, "--fail-over: -1 is below 0"
    ),
    row(
        "offsets import",
        f"offsets|import|--job|J|--from-table|a.b|--schema|{S}",
        USAGE,
        "argument --from-table: a table does not say which incarnation",
    ),
    row(
        "offsets import",
        f"offsets|import|--job|J|--from-consumer-group|g|--checkpoint-batch|1|--schema|{S}",
        USAGE,
        "argument --checkpoint-batch: goes with --from-spark-checkpoint",
    ),
    row("offsets history", f"offsets|history|--job|J|--limit|0|--schema|{S}", USAGE, "--limit: 0 is below 1"),
    row(
        "offsets explain",
        f"offsets|explain|--job|J|--topic|t|--partition|0|--schema|{S}",
        USAGE,
        "the following arguments are required: --offset",
    ),
    row("offsets prune", f"offsets|prune|--job|J|--keep|1|--schema|{S}", USAGE, "argument --reason"),
    # jobs
    row(
        "jobs list",
        f"jobs|list|--format|yaml|--schema|{S}",
        USAGE,
        "argument --format: invalid choice: 'yaml'",
    ),
    row("jobs retire", f"jobs|retire|--job|J|--schema|{S}", USAGE, "argument --reason"),
    row("jobs retire", f"jobs|retire|--job|ghost|--reason|r|--schema|{S}", ERROR, "unknown job 'ghost'"),
    # serve (nothing is bound)
    row("serve", "serve|--port|70000", USAGE, "argument --port: 70000 is above 65535"),
]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every command `txn-offsets --help` and its commands' --help list: sub-parsers, and the
    choices of a command's positional action (`db upgrade|downgrade|...`, `dev up|down|status`)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        for name, child in subs[0].choices.items():
            yield from _commands(child, (*path, name))
        return
    actions = [a for a in parser._actions if not a.option_strings and a.choices and a.dest == "action"]
    if actions:
        yield from (" ".join((*path, str(choice))) for choice in actions[0].choices)
    else:
        yield " ".join(path)


def test_the_table_covers_every_command() -> None:
    commands = set(_commands(build_parser()))
    assert "db grants" in commands and "offsets import" in commands and "dev status" in commands
    assert {r.command for r in ROWS} - {""} == commands


@pytest.fixture(scope="module")
def schema(services: Services, engine: sa.Engine) -> Iterator[str]:
    """A migrated schema with job J: a live run and t[0] = 10."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    db = DatabaseSettings(Secret(services.database_url), schema=name)
    migrate.upgrade(db)
    start_run(Store(engine, db), "J")
    seed(engine, db, "J", {("t", 0): 10})
    yield name
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


def _argv(r: Row, schema: str, tmp_path: Path, services: Services) -> list[str]:
    values = {
        S: schema,
        NONE: f"t_none_{uuid.uuid4().hex[:8]}",
        MISSING_DIR: str(tmp_path / "no-stack"),
        ME: str(make_url(services.database_url).username),
    }
    return [values.get(a, a) for a in r.argv]


@pytest.mark.parametrize("r", ROWS, ids=str)
def test_a_bad_input_is_one_line_and_its_exit_code(
    r: Row, schema: str, services: Services, engine: sa.Engine, tmp_path: Path
) -> None:
    env = services.environ()
    for name in ("TXN_OFFSETS_SCHEMA", "TXN_OFFSETS_LOG_FORMAT", "TXN_OFFSETS_STACK_DIR"):
        env.pop(name, None)
    done = subprocess.run(
        [ENTRY, *_argv(r, schema, tmp_path, services)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (r.code, ""), done.stderr
    err = done.stderr
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("txn-offsets: error: ") and "Traceback" not in err, err
    assert r.says in err, err
    assert SECRET not in err
    if r.code == USAGE:
        assert err.rstrip().endswith("--help`)"), err  # the help to read
    # nothing changed, nothing created
    db = DatabaseSettings(Secret(services.database_url), schema=schema)
    assert offsets_of(engine, db, "J") == {("t", 0): 10}
    assert not (tmp_path / "no-stack").exists()


def test_the_entry_point_is_the_installed_one() -> None:
    assert os.access(ENTRY, os.X_OK), ENTRY
