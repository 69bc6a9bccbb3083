"""Per-job roles, applied: ``txn-offsets db role --apply`` and ``db grants --apply``.

The statements come from :mod:`txn_offsets.store.roles`; here they run in one transaction, with
every value bound (the job name, the owner row) and the password never in SQL text: it is turned
into a SCRAM verifier by libpq on the client (``PQencryptPasswordConn``) before it is sent.

Both refuse a name that is no role of its own (PUBLIC, CURRENT_USER..., a predefined ``pg_*``
role: :func:`txn_offsets.store.roles.role_refusal`) before connecting, and ``apply_grants`` a role
that does not exist, a result table that does not exist, and a connection that does not own what
it would grant on (a GRANT without the grant option only warns, granting nothing). PostgreSQL's
"permission denied" (no CREATEROLE for ``apply_role``) is a ConfigError naming the connected role
and what to run instead; nothing is changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret
from txn_offsets.store.database import sqlstate
from txn_offsets.store.handle import Store
from txn_offsets.store.roles import job_role_grants, owner_of, role_statements, table_name, validate_role
from txn_offsets.store.runs import validate_job

__all__ = ["GrantResult", "apply_grants", "apply_role"]


@dataclass(frozen=True)
class GrantResult:
    role: str
    job: str | None
    previous_owner: str | None  # the job's owner before (None: it had none)
    statements: int


_DENIED = "42501"  # insufficient_privilege
_OWNED = sa.text(
    "SELECT c.oid IS NOT NULL AS found, coalesce(pg_has_role(c.relowner, 'USAGE'), false) AS mine "
    "FROM (SELECT to_regclass(:name) AS oid) r LEFT JOIN pg_catalog.pg_class c ON c.oid = r.oid"
)


@contextmanager
def _permitted(me: str, what: str, fix: str) -> Iterator[None]:
    """PostgreSQL's "permission denied" in the block as a ConfigError naming the connected role
    `me`, `what` it may not do, PostgreSQL's own words and `fix` (the transaction rolls back)."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        if sqlstate(exc) != _DENIED:
            raise
        said = getattr(getattr(exc.orig, "diag", None), "message_primary", None) or "permission denied"
        raise ConfigError(
            "database role", f"role {me!r} may not {what} ({said}): {fix} (nothing was changed)"
        ) from None


def _me(conn: sa.Connection) -> str:
    return str(conn.execute(sa.text("SELECT current_user")).scalar_one())


def _not_grantable(conn: sa.Connection, me: str, store: Store, tables: Sequence[str]) -> ConfigError | None:
    """Why the connected role cannot grant on the store's tables or on `tables`: a result table
    that does not exist, or a table it does not own (nor a member of its owner, nor a superuser:
    a GRANT there would only warn, granting nothing). None: it can. Missing store tables are
    left to the GRANT (:class:`~txn_offsets.errors.SchemaMissing`)."""
    store_tables = conn.execute(_OWNED, {"name": f'"{store.schema}".jobs'}).one()
    if store_tables.found and not store_tables.mine:
        return ConfigError(
            "database role",
            f"role {me!r} does not own the offset store's tables in schema {store.schema!r}: run "
            f"`txn-offsets db grants --apply` as their owner (nothing was changed)",
        )
    for t in tables:
        tschema, table = table_name(t)
        row = conn.execute(
            _OWNED, {"name": f'"{table}"' if tschema is None else f'"{tschema}"."{table}"'}
        ).one()
        if not row.found:
            return ConfigError("--table", f"{t}: no such table; create it first (nothing was changed)")
        if not row.mine:
            return ConfigError(
                "--table",
                f"{t}: role {me!r} does not own it: grant on it as its owner (nothing was changed)",
            )
    return None


def apply_role(store: Store, role: str, password: Secret | None) -> bool:
    """Create `role` (or bring an existing one to the job-role attributes) and set its password
    when given; returns whether the role was created. Refuses a superuser and the connected role
    itself (``ALTER ROLE ... NOSUPERUSER`` would strip an administrator), and raises a ConfigError
    naming the connected role when PostgreSQL denies it (no CREATEROLE); nothing is changed."""
    validate_role(role)
    with store.begin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT rolsuper, rolname = current_user AS me FROM pg_catalog.pg_roles WHERE rolname = :r"
            ),
            {"r": role},
        ).one_or_none()
        if row is not None and (row.rolsuper or row.me):
            what = "a superuser" if row.rolsuper else "the role this command is connected as"
            raise ConfigError(
                "--role", f"{role!r} is {what}: give each job a new role of its own (nothing was changed)"
            )
        fix = (
            "run `txn-offsets db role --apply` as a role with CREATEROLE (on PostgreSQL 16+ also "
            "ADMIN OPTION on an existing role), e.g. the database's administrator"
        )
        with _permitted(_me(conn), "create or alter roles", fix):
            for stmt in role_statements(role):
                conn.execute(sa.text(stmt))
            if password is not None:
                pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
                verifier = pgconn.encrypt_password(password.get().encode(), role.encode()).decode()
                # a verifier, not the password: ALTER ROLE takes no bind parameters
                conn.exec_driver_sql(f"ALTER ROLE \"{role}\" PASSWORD '{verifier}'")
    return row is None


def apply_grants(
    store: Store, role: str, *, job: str | None = None, tables: Sequence[str] = ()
) -> GrantResult:
    """Run :func:`job_role_grants` and, with `job`, make `role` the job's owner (replacing the
    previous owner, returned), in one transaction. Raises a ConfigError, changing nothing, when
    the role does not exist (or is no role of its own), a result table does not exist, or the
    connected role does not own what it would grant on or is denied a statement."""
    if job is not None:
        validate_job(job)
    stmts = job_role_grants(store.schema, role, tables)  # validates the role's name
    previous = None
    with store.begin() as conn:
        found = conn.execute(sa.text("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = :r"), {"r": role})
        if found.first() is None:
            raise ConfigError(
                "--role",
                f"role {role!r} does not exist: create it first (`txn-offsets db role --role {role} "
                f"--apply`), then grant again (nothing was changed)",
            )
        me = _me(conn)
        refused = _not_grantable(conn, me, store, tables)
        if refused is not None:
            raise refused
        with _permitted(me, "grant these rights", "run `txn-offsets db grants --apply` as the tables' owner"):
            for stmt in stmts:
                conn.execute(sa.text(stmt))
            if job is not None:
                previous = owner_of(conn, store.settings, job)
                owners = store.tables.owners
                ins = pg_insert(owners).values(job=job, role=role)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=[owners.c.job],
                        set_={"role": ins.excluded.role, "granted_at": sa.func.now()},
                    )
                )
    return GrantResult(role, job, previous, len(stmts) + (job is not None))
