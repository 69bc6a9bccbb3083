"""The real PostgreSQL: transactions commit, roll back, and values round-trip."""

from __future__ import annotations

import pytest
import sqlalchemy as sa


def test_write_and_read_back(engine: sa.Engine, pg_schema: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{pg_schema}"'))
        conn.execute(sa.text(f'CREATE TABLE "{pg_schema}".counts (k text PRIMARY KEY, n bigint NOT NULL)'))
        conn.execute(
            sa.text(f'INSERT INTO "{pg_schema}".counts VALUES (:k, :n)'),
            [{"k": f"key-{i}", "n": i} for i in range(50)],
        )
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(sa.text(f'UPDATE "{pg_schema}".counts SET n = n + 1000'))
        raise RuntimeError("roll back")
    with engine.connect() as conn:
        total = conn.execute(sa.text(f'SELECT sum(n), count(*) FROM "{pg_schema}".counts')).one()
    assert tuple(total) == (sum(range(50)), 50)


def test_server_is_postgres_15_or_newer(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        version = conn.execute(sa.text("SHOW server_version_num")).scalar_one()
    assert int(version) >= 150000
