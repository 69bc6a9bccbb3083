"""The Store handle (txn_offsets.store.handle) without a database: what it shows, what it caches, and
that the transactions it opens translate the driver's errors."""

from __future__ import annotations

import pickle

import pytest
import sqlalchemy as sa

from txn_offsets import ServiceUnavailable
from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import tables_for

URL = "postgresql+psycopg://u:pw-secret-3@127.0.0.1:1/x?sslpassword=key-secret-3"
DB = DatabaseSettings(Secret(URL), schema="s_handle", connect_timeout_s=1)


def test_its_repr_shows_no_secret() -> None:
    store = Store(sa.create_engine(URL), DB)
    assert "pw-secret-3" not in repr(store) and "key-secret-3" not in repr(store)
    assert "s_handle" in repr(store)


def test_the_tables_are_the_settings_schema_looked_up_once() -> None:
    store = Store(sa.create_engine(URL), DB)
    assert store.schema == "s_handle"
    assert store.tables is store.tables is tables_for("s_handle")
    assert store.tables.offsets.schema == "s_handle"


def test_its_transactions_translate_errors() -> None:
    store = Store(sa.create_engine(URL, connect_args={"connect_timeout": 1}), DB)  # nothing listens on port 1
    for opened in (store.begin, store.connect):
        with pytest.raises(ServiceUnavailable) as info, opened():
            pass
        assert "pw-secret-3" not in str(info.value)
    with pytest.raises(ServiceUnavailable), store.errors():
        store.engine.connect()
    store.engine.dispose()


def test_it_never_travels_to_an_executor() -> None:
    # the settings do (tasks take the worker's engine there); an engine, and so a Store, does not
    store = Store(sa.create_engine(URL), DB)
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):
        pickle.dumps(store)
