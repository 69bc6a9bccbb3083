"""Fixtures of the offset store tests: settings for a fresh schema, migrated, and a started run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Aggregate, Cli
from txn_offsets import cli
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run


@pytest.fixture
def db(database_url: str, pg_schema: str) -> DatabaseSettings:
    """Settings for this test's own (not yet created) schema."""
    return DatabaseSettings(Secret(database_url), schema=pg_schema)


@pytest.fixture
def migrated(db: DatabaseSettings) -> DatabaseSettings:
    """The schema, created and migrated to head."""
    assert migrate.upgrade(db) == migrate.head()
    return db


@pytest.fixture
def store(engine: sa.Engine, migrated: DatabaseSettings) -> Store:
    """The migrated schema's store, on the session's engine."""
    return Store(engine, migrated)


@pytest.fixture
def run(engine: sa.Engine, migrated: DatabaseSettings, job_name: str) -> Run:
    return start_run(Store(engine, migrated), job_name)


@pytest.fixture
def admin_engine(admin_database_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(admin_database_url, pool_size=2)
    yield eng
    eng.dispose()


@pytest.fixture
def aggregate(engine: sa.Engine, migrated: DatabaseSettings) -> Aggregate:
    return Aggregate(engine, migrated.schema)


@dataclass(frozen=True)
class Ctx:
    """The usual four fixtures of a commit test in one (keeps test signatures short)."""

    engine: sa.Engine
    db: DatabaseSettings
    run: Run
    agg: Aggregate

    @property
    def store(self) -> Store:
        return Store(self.engine, self.db)


@pytest.fixture
def ctx(engine: sa.Engine, migrated: DatabaseSettings, run: Run, aggregate: Aggregate) -> Ctx:
    return Ctx(engine, migrated, run, aggregate)


@pytest.fixture
def run_cli(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    kafka_bootstrap: str,
) -> Cli:
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", database_url)
    monkeypatch.setenv("TXN_OFFSETS_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.delenv("TXN_OFFSETS_SCHEMA", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
