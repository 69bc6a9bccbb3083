"""Input validation of the store's API and CLI that needs no database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from tests.unproven import commit_ranges
from txn_offsets import ConfigError, SchemaMissing, ServiceUnavailable, cli
from txn_offsets.admin.reset import ResetTarget
from txn_offsets.config import DatabaseSettings, database_from_env, kafka_from_env
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store.database import is_connection_lost, is_retryable, translate_errors
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, validate_job
from txn_offsets.store.schema import metadata_for, tables_for

DB = DatabaseSettings(Secret("postgresql+psycopg://u:pw-secret-2@db.invalid:5432/x"), schema="s1")


class _FakeDriverError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _dbapi(cls: type[sa.exc.DBAPIError], message: str, sqlstate: str | None) -> sa.exc.DBAPIError:
    return cls("SELECT 1", {}, _FakeDriverError(message, sqlstate))


def test_tables_are_per_schema_and_cached() -> None:
    assert tables_for("s1") is tables_for("s1")
    assert tables_for("s1").offsets.schema == "s1" and tables_for("s2").offsets.schema == "s2"
    assert set(metadata_for("s1").tables) == {
        "s1.jobs",
        "s1.offsets",
        "s1.offset_audit",
        "s1.dead_letters",
        "s1.job_stats",
        "s1.stream_plans",
        "s1.job_owners",
        "s1.commits",
        "s1.job_runs",
    }


@pytest.mark.parametrize("schema", ["Bad", "x-y", "a;drop", "", "1abc"])
def test_schema_names_are_validated(schema: str) -> None:
    with pytest.raises(ConfigError, match="schema"):
        tables_for(schema)


def test_commit_ranges_validates_before_touching_the_database() -> None:
    # the engine would fail on connect: validation must come first
    engine = sa.create_engine("postgresql+psycopg://u@db.invalid:1/x")
    run = Run("j", 1, "r")
    with pytest.raises(ConfigError, match="non-empty"):
        commit_ranges(Store(engine, DB), run, [])
    with pytest.raises(ConfigError, match="non-empty"):
        commit_ranges(Store(engine, DB), run, OffsetRange("t", 0, 0, 1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="run"):
        commit_ranges(Store(engine, DB), ("j", 1), [OffsetRange("t", 0, 0, 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize(("start", "until"), [(-1, 5), (5, 4)])
def test_bad_ranges_are_refused(start: int, until: int) -> None:
    with pytest.raises(ConfigError):
        OffsetRange("t", 0, start, until)


@pytest.mark.parametrize("job", ["", " ", "a" * 201, "tab\tname"])
def test_job_names(job: str) -> None:
    with pytest.raises(ConfigError, match="job"):
        validate_job(job)


def test_error_classification() -> None:
    assert is_retryable(_dbapi(sa.exc.OperationalError, "could not serialize", "40001"))
    assert is_retryable(_dbapi(sa.exc.OperationalError, "deadlock detected", "40P01"))
    assert not is_connection_lost(_dbapi(sa.exc.OperationalError, "could not serialize", "40001"))
    assert is_connection_lost(_dbapi(sa.exc.OperationalError, "server closed the connection", None))
    assert is_connection_lost(_dbapi(sa.exc.OperationalError, "terminating connection", "57P01"))
    assert not is_connection_lost(_dbapi(sa.exc.IntegrityError, "duplicate key", "23505"))


def test_translate_errors_never_leaks_the_password() -> None:
    with pytest.raises(ServiceUnavailable) as info, translate_errors(DB):
        raise _dbapi(sa.exc.OperationalError, "auth failed for password pw-secret-2", "28P01")
    assert "pw-secret-2" not in str(info.value) and "u:***@db.invalid" in str(info.value)
    with pytest.raises(SchemaMissing, match="'s1'"), translate_errors(DB):
        raise _dbapi(sa.exc.ProgrammingError, 'relation "s1.offsets" does not exist', "42P01")
    with pytest.raises(sa.exc.IntegrityError), translate_errors(DB):
        raise _dbapi(sa.exc.IntegrityError, "duplicate key", "23505")


def test_settings_from_env() -> None:
    db = database_from_env({"TXN_OFFSETS_DATABASE_URL": "postgresql://u:p@h/d", "TXN_OFFSETS_SCHEMA": "abc"})
    assert db.schema == "abc" and "p@" not in repr(db)
    assert database_from_env({"TXN_OFFSETS_DATABASE_URL": "postgresql://u:p@h/d"}, schema="z").schema == "z"
    with pytest.raises(ConfigError, match="TXN_OFFSETS_DATABASE_URL"):
        database_from_env({})
    assert kafka_from_env({}, bootstrap="k:9092").bootstrap_servers == "k:9092"
    with pytest.raises(ConfigError, match="TXN_OFFSETS_KAFKA_BOOTSTRAP"):
        kafka_from_env({})


def test_reset_targets() -> None:
    assert ResetTarget("earliest").needs_kafka
    # an explicit offset is checked against the log (issue 23), unless forced outside it
    assert ResetTarget("offset", value=3).needs_kafka
    assert not ResetTarget("offset", value=3, allow_outside_log=True).needs_kafka
    assert ResetTarget("earliest", allow_outside_log=True).needs_kafka
    assert ResetTarget("datetime", at=datetime(2024, 1, 1, tzinfo=UTC)).needs_kafka
    with pytest.raises(ConfigError, match="negative"):
        ResetTarget("offset", value=-1)
    with pytest.raises(ConfigError, match="timezone"):
        ResetTarget("datetime", at=datetime(2024, 1, 1))  # naive on purpose
    with pytest.raises(ConfigError, match="needs a value"):
        ResetTarget("shift")


def test_cli_reset_needs_exactly_one_target(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["offsets", "reset", "--job", "j", "--to-earliest", "--to-latest"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["offsets", "reset", "--job", "j"])
    args = parser.parse_args(["offsets", "reset", "--job", "j", "--shift-by", "-3", "--partition", "1"])
    assert (args.shift_by, args.partition, args.schema) == (-3, [1], "txn_offsets")


def test_cli_has_no_database_url_option() -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["jobs", "list", "--database-url", "postgresql://u:p@h/d"])
