"""The CLI's usage errors offline: no value that could be a secret is echoed, `--format`'s help and
its refusal name every command that prints rows, `--to-datetime` needs ISO 8601 with a timezone,
and a missing `--reason` or revision is a usage error (64) before anything connects."""

from __future__ import annotations

import argparse

import pytest

from txn_offsets.cli import build_parser, main
from txn_offsets.cli.main import unechoed
from txn_offsets.cli.options import aware_datetime

SECRET = "pw-secret-44"
URL = f"postgresql://app:{SECRET}@db.example:5432/app?sslpassword={SECRET}"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["jobs", "list", "--database-url", URL], "unrecognized arguments: --database-url and values"),
        (["jobs", "list", f"--database-url={URL}"], "unrecognized arguments: --database-url and values"),
        (["jobs", "list", URL], "unrecognized arguments (their values are not echoed)"),
        (["--database-url", URL, "jobs", "list"], "invalid choice: 'postgresql://***'"),
        (["offsets", "history", "--job", "j", "--limit", URL], "argument --limit: 'postgresql://***'"),
        (["jobs", "list", "--format", f"password={SECRET}"], "invalid choice: 'password=***'"),
        (["serve", "--port", f"app:{SECRET}@db"], "argument --port: '***@db' is not a whole number"),
    ],
)
def test_a_usage_error_echoes_no_secret(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TXN_OFFSETS_DATABASE_URL", raising=False)
    assert main(argv) == 64
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert says in err and SECRET not in err, err


def test_the_database_url_option_says_where_the_url_comes_from() -> None:
    said = unechoed(f"unrecognized arguments: --database-url {URL} --verbose-ish")
    assert said == (
        "unrecognized arguments: --database-url --verbose-ish and values (not echoed); the database URL "
        "is read from $TXN_OFFSETS_DATABASE_URL only, never from an argument"
    )
    assert unechoed("unrecognized arguments: --nope") == "unrecognized arguments: --nope"


def _row_commands(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if child.get_default("takes_format"):
                    found.add(child.prog.removeprefix("txn-offsets "))
                found |= _row_commands(child)
    return found


def test_format_help_and_refusal_name_every_command_that_prints_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    commands = _row_commands(parser)
    assert {"offsets explain", "offsets prune", "offsets show", "jobs list"} <= commands
    (fmt,) = [a for a in parser._actions if "--format" in a.option_strings]
    assert fmt.help is not None
    for command in commands:
        group, name = command.split()
        assert group in fmt.help and name in fmt.help, (command, fmt.help)
    assert main(["--format", "json", "db", "check"]) == 64
    err = capsys.readouterr().err
    assert "offsets show|lag|prune|history|explain, jobs list" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("yesterday", "'yesterday' is not an ISO 8601 datetime"),
        ("2024-01-01T00:00:00", "'2024-01-01T00:00:00' has no timezone"),
        ("2024-13-01T00:00:00Z", "is not an ISO 8601 datetime"),
    ],
)
def test_to_datetime_needs_iso_8601_with_a_timezone(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        aware_datetime(text)
    assert aware_datetime("2024-01-01T00:00:00+02:00").utcoffset() is not None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["offsets", "reset", "--job", "j", "--to-offset", "1"],
            "argument --reason: say why the offsets move",
        ),
        (["offsets", "reset", "--job", "j", "--to-offset", "1", "--reason", "  "], "argument --reason"),
        (["offsets", "prune", "--job", "j"], "argument --reason: say why the lineage is pruned"),
        (["jobs", "retire", "--job", "j"], "argument --reason: say why the job is retired"),
        (["db", "downgrade"], "argument revision: give the revision to go down to"),
        (["db", "check", "base"], "argument revision: goes with `db upgrade` and `db downgrade`"),
        (["db", "role", "--role", "r", "--table", "t"], "argument --table: goes with `db grants`"),
        (["offsets", "reset", "--job", "j", "--to-datetime", "now", "--reason", "r"], "--to-datetime"),
    ],
)
def test_a_missing_or_malformed_argument_is_64_before_connecting(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", "postgresql://u:p@127.0.0.1:1/nowhere")
    assert main(argv) == 64
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err
    assert err.rstrip().endswith("--help`)"), err
