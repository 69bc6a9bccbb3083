"""A ``postgres://`` URL - what many platforms' DATABASE_URL holds - works as the CLI's
TXN_OFFSETS_DATABASE_URL and as the library's DatabaseSettings (issue 44, item 6; before: "'postgres'
URLs are not supported: txn_offsets needs PostgreSQL"), and its password is never printed."""

from __future__ import annotations

import json
import os

import sqlalchemy as sa

from tests.fix_services import run_module
from tests.integration.helpers import seed
from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


def _as_postgres(url: str) -> str:
    scheme, rest = url.split("://", 1)
    assert scheme.startswith("postgresql"), scheme
    return f"postgres://{rest}"


def test_a_postgres_url_connects(
    database_url: str, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t-scheme", 0): 7})
    url = _as_postgres(database_url)
    password = sa.engine.make_url(database_url).password
    assert password

    db = DatabaseSettings(url, schema=migrated.schema)  # the library
    store = Store.of(db)
    try:
        with store.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == db.url.database
    finally:
        store.engine.dispose()

    env = {**os.environ, "TXN_OFFSETS_DATABASE_URL": url}  # the CLI
    argv = ["offsets", "show", "--job", job_name, "--schema", migrated.schema, "--format", "json"]
    done = run_module("txn_offsets.cli", *argv, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["topic"], r["partition"], r["offset"]) for r in rows] == [("t-scheme", 0, 7)], rows
    assert password not in done.stdout + done.stderr
