"""The schemes a database URL may have (issue 44, item 6): ``postgres://`` - what many platforms'
DATABASE_URL holds - and ``postgresql://`` mean PostgreSQL through psycopg 3, like
``postgresql+psycopg://``; other databases and drivers are refused, never showing the password."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.config import DatabaseSettings, database_from_env
from txn_offsets.errors import ConfigError

SCHEMES = ("postgres", "postgresql", "postgres+psycopg", "postgresql+psycopg")

_name = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
_password = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=4, max_size=20)


@given(
    scheme=st.sampled_from(SCHEMES),
    user=_name,
    password=_password,
    host=st.sampled_from(["db.example.com", "127.0.0.1", "localhost"]),
    port=st.integers(1, 65535),
    dbname=_name,
    query=st.sampled_from(["", "?sslmode=verify-full", "?application_name=x&connect_timeout=5"]),
)
def test_every_postgres_scheme_is_postgresql_psycopg(
    scheme: str, user: str, password: str, host: str, port: int, dbname: str, query: str
) -> None:
    raw = f"{scheme}://{user}:{quote(password, safe='')}@{host}:{port}/{dbname}{query}"
    url = DatabaseSettings(raw).url
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        user,
        password,
        host,
        port,
        dbname,
    )
    assert dict(url.query) == DatabaseSettings(raw.replace(scheme, "postgresql+psycopg", 1)).url.query


def test_the_environment_variable_takes_postgres_urls() -> None:
    db = database_from_env({"TXN_OFFSETS_DATABASE_URL": "postgres://app:s3cr3t-pw@db:5432/offsets"})
    assert db.display_url == "postgresql+psycopg://app:***@db:5432/offsets"
    assert "s3cr3t-pw" not in repr(db)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://u:pw-secret-1@localhost/db", "'mysql' URLs are not supported"),
        ("postgres+psycopg2://u:pw-secret-1@localhost/db", "driver 'psycopg2' is not supported"),
        ("postgresql+asyncpg://u:pw-secret-1@localhost/db", "driver 'asyncpg' is not supported"),
        ("sqlite:///pw-secret-1.db", "'sqlite' URLs are not supported"),
    ],
)
def test_other_databases_and_drivers_are_refused_without_the_password(url: str, said: str) -> None:
    with pytest.raises(ConfigError, match="database_url") as refused:
        DatabaseSettings(url)
    assert said in str(refused.value) and "pw-secret-1" not in str(refused.value)
