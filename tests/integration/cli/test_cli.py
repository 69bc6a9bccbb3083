"""The admin CLI end to end, through cli.main, against real PostgreSQL and Kafka."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, produce_counts, seed
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import migrate
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, start_run


def test_db_commands(run_cli: Cli, db: DatabaseSettings) -> None:
    s = ["--schema", db.schema]
    assert run_cli("db", "current", *s)[1].strip().endswith("(not created)")
    code, out, _ = run_cli("db", "upgrade", *s)
    assert code == 0 and f"at revision {migrate.head()}" in out
    assert "(head)" in run_cli("db", "current", *s)[1]
    assert run_cli("db", "check", *s)[:2] == (0, f"schema {db.schema!r} is at head and matches the models\n")
    code, out, _ = run_cli("db", "downgrade", "base", *s)
    assert code == 0 and "revision None" in out
    code, _, err = run_cli("db", "downgrade", *s)  # a missing argument: a usage error
    assert code == 64 and "argument revision: give the revision" in err


def test_offsets_show_reset_and_jobs_end_to_end(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    s = ["--schema", migrated.schema]
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 5, 1: 3})
    live = start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 0, (topic, 1): 1})

    code, out, _ = run_cli("offsets", "show", "--job", job_name, *s)
    assert code == 0
    assert re.search(rf"{job_name}\s+{topic}\s+0\s+0\s", out) and re.search(rf"{topic}\s+1\s+1\s", out)

    # dry run: prints the plan and the live run, changes nothing
    reset = ["offsets", "reset", "--job", job_name, "--topic", topic, "--to-latest", *s]
    code, out, _ = run_cli(*reset, "--dry-run")
    assert code == 0
    assert f"{topic}[0]  0 -> 5  (+5)" in out and f"{topic}[1]  1 -> 3  (+2)" in out
    assert live.run_id in out and "dry run: nothing changed" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 0, (topic, 1): 1}

    # refused while the run is live: the plan is shown, then one error line, exit 1
    code, out, err = run_cli(*reset, "--reason", "skip backlog")
    assert code == 1 and f"{topic}[0]  0 -> 5" in out
    assert err.startswith("txn-offsets: error: job") and live.run_id in err and "--force" in err
    assert err.count("\n") == 1
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 0, (topic, 1): 1}

    # forced: applied, audited, generation bumped, the live run fenced
    code, out, _ = run_cli(*reset, "--reason", "skip backlog", "--force")
    assert code == 0 and f"generation is now {live.generation + 1}" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 5, (topic, 1): 3}
    with engine.connect() as conn:
        state = lock_job(conn, migrated, job_name, for_update=False)
    assert (state.generation, state.live) == (live.generation + 1, False)

    code, out, _ = run_cli("offsets", "history", "--job", job_name, *s)
    assert code == 0
    lines = [line for line in out.splitlines() if " reset " in line]
    assert len(lines) == 2 and all("skip backlog" in line for line in lines)
    assert re.search(rf"{topic}\s+0\s+0\s+5\s+reset\s+\S+@\S+", out)  # actor is user@host

    # no live run any more: other targets need no --force
    code, _, err = run_cli(*reset[:6], "--shift-by", "-2", "--partition", "0", "--reason", "replay two", *s)
    assert code == 0, err
    code, _, err = run_cli(*reset[:6], "--to-earliest", "--reason", "replay all", *s)
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 0, (topic, 1): 0}
    code, _, err = run_cli(*reset[:6], "--to-datetime", "2999-01-01T00:00:00Z", "--reason", "to end", *s)
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 5, (topic, 1): 3}
    code, _, err = run_cli("offsets", "reset", "--job", job_name, "--to-offset", "1", "--reason", "all", *s)
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 1, (topic, 1): 1}

    code, out, _ = run_cli("jobs", "list", *s)
    assert code == 0
    assert re.search(rf"{job_name}\s+{live.generation + 5}\s+idle\s+-\s+\S+\s+2", out), out


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--to-datetime", "2024-01-01T00:00:00", "--reason", "x"], 64, "has no timezone"),
        (["--to-datetime", "yesterday", "--reason", "x"], 64, "ISO 8601"),
        (["--to-offset", "3"], 64, "argument --reason"),
        (["--to-offset", "3", "--partition", "0", "--reason", "x"], 64, "--partition: needs --topic"),
        (["--shift-by", "-100", "--reason", "x", "--allow-outside-log"], 64, "would move to -90"),
        (["--shift-by", "-1", "--reason", "x"], 1, "topic 't' does not exist"),  # no log to clamp to
        (["--to-latest", "--topic", "no-such-topic-x", "--reason", "x"], 1, "does not exist"),
    ],
)
def test_bad_reset_inputs_change_nothing(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    extra: list[str],
    code: int,
    message: str,
) -> None:
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t", 0): 10})
    got, _, err = run_cli("offsets", "reset", "--job", job_name, "--schema", migrated.schema, *extra)
    assert got == code
    assert message in err and err.count("\n") == 1
    assert offsets_of(engine, migrated, job_name) == {("t", 0): 10}


def test_unknown_job(run_cli: Cli, migrated: DatabaseSettings) -> None:
    code, _, err = run_cli(
        "offsets", "reset", "--job", "ghost", "--to-offset", "0", "--reason", "x", "--schema", migrated.schema
    )
    assert code == 1 and "unknown job 'ghost'" in err
    code, _, err = run_cli("offsets", "show", "--job", "ghost", "--schema", migrated.schema)
    assert code == 1 and "unknown job 'ghost'" in err


def test_missing_schema(run_cli: Cli, db: DatabaseSettings) -> None:
    code, _, err = run_cli("offsets", "show", "--schema", db.schema)
    assert code == 1
    assert f"schema {db.schema!r} are missing" in err and "txn-offsets db upgrade" in err


def test_bad_schema_name(run_cli: Cli) -> None:
    code, _, err = run_cli("jobs", "list", "--schema", "Robert'); DROP TABLE x;--")
    assert code == 1 and "not a valid identifier" in err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:pw-secret-1@localhost/db", "'mysql' URLs are not supported"),
        ("not a url pw-secret-1", "cannot parse it"),
        (
            "postgresql://u:pw-secret-1@127.0.0.1:1/db",
            "cannot reach PostgreSQL at postgresql+psycopg://u:***@127.0.0.1:1/db",
        ),
    ],
)
def test_bad_database_urls_are_clear_and_never_show_the_password(
    run_cli: Cli, monkeypatch: pytest.MonkeyPatch, url: str, message: str
) -> None:
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", url)
    code, out, err = run_cli("jobs", "list")
    assert code == 1
    assert message in err
    assert "pw-secret-1" not in out + err


def test_database_url_must_come_from_the_environment(run_cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXN_OFFSETS_DATABASE_URL")
    code, _, err = run_cli("jobs", "list")
    assert code == 1 and "TXN_OFFSETS_DATABASE_URL: is not set" in err


def test_json_formats_of_show_jobs_and_history(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    s = ["--schema", migrated.schema]
    live = start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t", 0): 4, ("t", 1): 7})

    code, out, _ = run_cli("offsets", "show", "--job", job_name, "--format", "json", *s)
    assert code == 0
    shown = json.loads(out)
    assert [(r["job"], r["topic"], r["partition"], r["offset"]) for r in shown] == [
        (job_name, "t", 0, 4),
        (job_name, "t", 1, 7),
    ]
    assert all(datetime.fromisoformat(r["updated_at"]).tzinfo is not None for r in shown)

    code, out, _ = run_cli("jobs", "list", "--format", "json", *s)
    assert code == 0
    (job,) = json.loads(out)
    assert (job["job"], job["generation"], job["state"], job["live"]) == (
        job_name,
        live.generation,
        "live",
        True,
    )
    assert (job["run_id"], job["partitions"]) == (live.run_id, 2)

    code, out, _ = run_cli("offsets", "history", "--job", job_name, "--format", "json", *s)
    assert code == 0
    rows = json.loads(out)
    assert sorted((r["topic"], r["partition"], r["old"], r["new"], r["action"]) for r in rows) == [
        ("t", 0, None, 4, "seed"),
        ("t", 1, None, 7, "seed"),
    ]
    code, _, err = run_cli("jobs", "list", "--format", "yaml", *s)  # a usage error: exit code 64
    assert code == 64 and "invalid choice: 'yaml'" in err
