"""A job's role is a role of its own (issue 42, item 5), and the models mirror migration 0011's
topic constraints. Pure: no database."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from tests import migration_scripts
from txn_offsets.cli import exits, main
from txn_offsets.errors import ConfigError
from txn_offsets.store.roles import (
    PSEUDO_ROLES,
    job_role_grants,
    owner_statement,
    role_refusal,
    role_statements,
    validate_role,
)
from txn_offsets.store.schema import tables_for

REFUSED = (*sorted(PSEUDO_ROLES), "pg_monitor", "pg_read_all_data", "pg_write_all_data", "pg_anything")
ACCEPTED = ("job_a", "job_runner", "public_jobs", "pgx", "p_g", "none_of_them", "current_users")


@pytest.mark.parametrize("role", REFUSED)
def test_pseudo_and_predefined_roles_are_refused(role: str) -> None:
    problem = role_refusal(role)
    assert problem is not None and repr(role) in problem and "db role" in problem
    for build in (
        lambda: validate_role(role),
        lambda: job_role_grants("txn_offsets", role),
        lambda: role_statements(role),
        lambda: owner_statement("txn_offsets", "clicks", role),
    ):
        with pytest.raises(ConfigError, match=re.escape(repr(role))):
            build()


@pytest.mark.parametrize("role", ACCEPTED)
def test_ordinary_role_names_are_accepted(role: str) -> None:
    assert role_refusal(role) is None
    assert validate_role(role) == role
    assert job_role_grants("txn_offsets", role)[0] == f'GRANT USAGE ON SCHEMA "txn_offsets" TO "{role}"'


@pytest.mark.parametrize("role", ["public", "current_user", "pg_monitor"])
@pytest.mark.parametrize("command", ["grants", "role"])
def test_the_cli_calls_them_usage_errors_before_printing_anything(
    role: str, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TXN_OFFSETS_DATABASE_URL", raising=False)  # printing needs no database
    assert main(["db", command, "--role", role]) == exits.USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("txn-offsets: error: argument --role: ") and repr(role) in err
    assert len(err.strip().splitlines()) == 1


def test_public_is_named_as_every_role(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "grants", "--role", "public", "--job", "clicks"]) == exits.USAGE
    assert "PUBLIC, every role" in capsys.readouterr().err


def test_the_models_mirror_the_topic_constraints_of_0014() -> None:
    migration = migration_scripts.load("0014")
    tables = tables_for("txn_offsets")
    checks = {
        (table.name, str(c.name)): str(c.sqltext)
        for table in (tables.offsets, tables.audit, tables.dead_letters, tables.commits, tables.stream_plans)
        for c in table.constraints
        if isinstance(c, sa.CheckConstraint) and "legal" in str(c.name)
    }
    # the same names (the models' naming convention) and the same text, character for character
    expected = {(t, f"{t}_topic_legal_check"): migration.TOPIC_CHECK for t in migration.TOPIC_COLUMNS}
    expected["stream_plans", migration.PLANS_LEGAL] = migration.PLANS_CHECK
    assert checks == expected


def test_0014_restores_the_checks_of_0011_character_for_character() -> None:
    old, new = migration_scripts.load("0011"), migration_scripts.load("0014")
    assert (new.OLD_TOPIC_CHECK, new.OLD_PLANS_CHECK) == (old.TOPIC_CHECK, old.PLANS_CHECK)
    assert new.TOPIC_COLUMNS == old.TOPIC_COLUMNS and new.PLANS_LEGAL == old.PLANS_LEGAL
    # no bounded repetition of the topic's characters is left (what made the checks slow)
    assert "{1,249}" not in new.TOPIC_CHECK + new.PLANS_CHECK
