"""`db role --apply` and `db grants --apply` run as a role that may not do it: one line naming the
connected role and the fix, exit 1, nothing changed - never PostgreSQL's traceback, never the
password. Through the installed entry point, as a role of the test's own without CREATEROLE."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.fix_services import Services
from txn_offsets.config import DatabaseSettings

ENTRY = str(Path(sys.executable).with_name("txn-offsets"))
PASSWORD = "pw-secret-44-role"  # a test role's password, checked never to be shown


@pytest.fixture
def plain_role(admin_engine: sa.Engine, services: Services) -> Iterator[tuple[str, str]]:
    """(name, URL) of a LOGIN role without CREATEROLE, not the owner of anything."""
    name = f"plain_{uuid.uuid4().hex[:10]}"
    with admin_engine.begin() as conn:  # generated hex names and password: nothing to quote
        conn.execute(sa.text(f"CREATE ROLE {name} LOGIN NOCREATEROLE PASSWORD '{PASSWORD}'"))
        conn.execute(
            sa.text(f"GRANT CONNECT ON DATABASE {make_url(services.database_url).database} TO {name}")
        )
    url = make_url(services.database_url).set(username=name, password=PASSWORD)
    yield name, url.render_as_string(hide_password=False)
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {name}"))
        conn.execute(sa.text(f"DROP ROLE {name}"))


def _run(services: Services, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **services.environ(),
        "TXN_OFFSETS_DATABASE_URL": url,
        "TXN_OFFSETS_ROLE_PASSWORD": PASSWORD + "-new",
    }
    return subprocess.run([ENTRY, *argv], env=env, capture_output=True, text=True, timeout=120, check=False)


def _role_exists(engine: sa.Engine, name: str) -> bool:
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": name}).first()
    return found is not None


def test_db_role_without_createrole_is_one_line(
    services: Services, admin_engine: sa.Engine, plain_role: tuple[str, str]
) -> None:
    me, url = plain_role
    target = f"job_{uuid.uuid4().hex[:10]}"
    done = _run(services, url, "db", "role", "--role", target, "--apply")
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    err = done.stderr
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"txn-offsets: error: database role: role '{me}' may not create or alter roles ")
    assert "permission denied to create role" in err and "CREATEROLE" in err and "nothing was changed" in err
    assert PASSWORD not in err
    assert not _role_exists(admin_engine, target)


def test_db_grants_by_a_role_that_owns_nothing_is_one_line(
    services: Services, admin_engine: sa.Engine, migrated: DatabaseSettings, plain_role: tuple[str, str]
) -> None:
    me, url = plain_role
    target = f"job_{uuid.uuid4().hex[:10]}"
    with admin_engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {target}"))
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{migrated.schema}" TO {me}'))
        conn.execute(
            sa.text(f'GRANT SELECT ON "{migrated.schema}".jobs TO {me}')
        )  # a privilege, no grant option
    try:
        done = _run(services, url, "db", "grants", "--role", target, "--apply", "--schema", migrated.schema)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        err = done.stderr
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"role '{me}' does not own the offset store's tables in schema '{migrated.schema}'" in err
        assert "nothing was changed" in err
        with admin_engine.connect() as conn:
            granted = conn.execute(
                sa.text("SELECT has_table_privilege(:r, :t, 'INSERT')"),
                {"r": target, "t": f'"{migrated.schema}".offsets'},
            ).scalar_one()
        assert granted is False
    finally:
        with admin_engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {target}"))
            conn.execute(sa.text(f"DROP ROLE {target}"))
