"""Per-job roles, applied: ``txn-offsets db role --apply`` and ``db grants --apply``.

The statements come from :mod:`txn_offsets.store.roles`; here they run in one transaction, with
every value bound (the job name, the owner row) and the password never in SQL text: it is turned
into a SCRAM verifier by libpq on the client (``PQencryptPasswordConn``) before it is sent.

Both refuse a name that is no role of its own (PUBLIC, CURRENT_USER..., a predefined ``pg_*``
role: :func:`txn_offsets.store.roles.role_refusal`) before connecting, and ``apply_grants`` a role
that does not exist (granting to it would fail; nothing is changed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret
from txn_offsets.store.handle import Store
from txn_offsets.store.roles import job_role_grants, owner_of, role_statements, validate_role
from txn_offsets.store.runs import validate_job

__all__ = ["GrantResult", "apply_grants", "apply_role"]


@dataclass(frozen=True)
class GrantResult:
    role: str
    job: str | None
    previous_owner: str | None  # the job's owner before (None: it had none)
    statements: int


def apply_role(store: Store, role: str, password: Secret | None) -> bool:
    """Create `role` (or bring an existing one to the job-role attributes) and set its password
    when given; returns whether the role was created. Refuses a superuser and the connected role
    itself: ``ALTER ROLE ... NOSUPERUSER`` would strip an administrator."""
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
    previous owner, returned), in one transaction. Raises a ConfigError naming the role when it
    does not exist (or is no role of its own), before anything is changed."""
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
