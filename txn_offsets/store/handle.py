"""The offset store as one object: an engine, its settings, their tables and the translation of errors.

What alembic's ``Config`` is to its commands, :class:`Store` is to the driver-side functions of
txn_offsets (admin, CLI, service, the store's own statements): one handle instead of the loose
``(engine, db)`` pair, so the tables of the settings' schema are looked up once and every
transaction opened through it turns "cannot reach the database" and "our tables are missing"
into the library's errors (:func:`txn_offsets.store.database.translate_errors`).

A Store never crosses to Spark executors (an engine is not picklable): task-side code carries the
:class:`~txn_offsets.config.DatabaseSettings` and takes the worker's engine there
(:func:`txn_offsets.store.database.worker_engine`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.store.database import engine_for, translate_errors
from txn_offsets.store.schema import Tables, tables_for

__all__ = ["Store"]


@dataclass(frozen=True)
class Store:
    """An engine and the settings it was built from (``Store.of(settings)`` builds the engine).

    Its repr shows the settings only (their URL without secrets): an engine's repr shows the
    URL's secret query parameters (``sslpassword=``) as they are."""

    engine: sa.Engine = field(repr=False)
    settings: DatabaseSettings

    @classmethod
    def of(cls, settings: DatabaseSettings, **kwargs: object) -> Store:
        """A Store on a new engine for `settings` (:func:`~txn_offsets.store.database.engine_for`,
        which takes `kwargs`); the caller disposes of it (``store.engine.dispose()``)."""
        return cls(engine_for(settings, **kwargs), settings)

    @functools.cached_property
    def tables(self) -> Tables:
        """The tables of the settings' schema."""
        return tables_for(self.settings.schema)

    @property
    def schema(self) -> str:
        return self.settings.schema

    def errors(self) -> AbstractContextManager[None]:
        """Database errors of the block translated (:func:`~txn_offsets.store.database.translate_errors`)."""
        return translate_errors(self.settings)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sa.Connection]:
        """A connection (SQLAlchemy's autobegin, rolled back unless committed), errors translated."""
        with self.errors(), self.engine.connect() as conn:
            yield conn

    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A connection in a transaction committed at the end of the block, errors translated."""
        with self.errors(), self.engine.begin() as conn:
            yield conn
