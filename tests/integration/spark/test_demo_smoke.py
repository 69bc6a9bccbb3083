"""``make demo`` as a subprocess, small: the README's first command must keep working (its import of
the offsets store once broke without any test noticing). The demo checks every total and every
stored offset against what it produced and prints ``verified=ok``.

It runs as the local stack's env file sets it up: TXN_OFFSETS_DATABASE_URL a login run role with no
grants of its own (the stack's ``job_runner``; here one made for the test) and
TXN_OFFSETS_OWNER_DATABASE_URL the owner, which migrates and grants it the store and the examples'
tables (``examples.migrate.prepare``): the job runs without the warning of a job run as the owner."""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.fix_services import Services, run_module


@pytest.fixture
def run_role_url(services: Services) -> Iterator[str]:
    """A fresh login role (NOSUPERUSER ..., no grants) and its URL; dropped afterwards."""
    role, password = f"demo_run_{uuid.uuid4().hex[:10]}", secrets.token_hex(16)
    admin = sa.create_engine(services.admin_database_url)
    with admin.begin() as conn:  # generated hex: nothing to quote
        conn.execute(
            sa.text(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOBYPASSRLS PASSWORD '{password}'")
        )
    try:
        url = sa.engine.make_url(services.database_url).set(username=role, password=password)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


def test_demo_smoke(services: Services, run_role_url: str) -> None:
    args = ("--messages", "3000", "--max-per-partition", "200")
    env = services.environ()
    env |= {"TXN_OFFSETS_DATABASE_URL": run_role_url, "TXN_OFFSETS_OWNER_DATABASE_URL": services.database_url}
    done = run_module("examples.demo", *args, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"demo: messages=3000 batches=\d+ seconds=[\d.]+ verified=ok", last), last
    assert "runs as database role" not in done.stderr, done.stderr[-2000:]  # as the run role, not the owner
