"""Least privilege per job: the statements that give a role one job, and the run's role check.

Since migration 0006 every row of ``jobs``, ``offsets``, ``offset_audit``, ``dead_letters``,
``job_stats`` and ``stream_plans`` is reachable (row-level security, ENABLE + FORCE) only when
``job_reachable(job, current_user)`` holds: current_user owns the job (``job_owners``), or is the
owner of the tables or the schema (the admin), or nobody owns the job and current_user owns no
job (a role granted the old, shared way). The boundary is current_user - what PostgreSQL
authenticated - never a setting the client chooses, so it holds behind PgBouncer unchanged. Since
migration 0011 the helper functions answer only about roles the session may act as (and to the
store's owner): a run role learns its own scope and jobs, never another role's.

A job's role is a real role: never PUBLIC (a quoted "public" is PUBLIC too), a role specifier
(CURRENT_USER, SESSION_USER, CURRENT_ROLE), NONE, or one of PostgreSQL's predefined ``pg_*``
roles (:func:`role_refusal`); granting it a job's rights would hand them to every role, or to every
member of a built-in role.

Statements are built from validated identifiers (quoting is then enough); values are bound when
executed (:mod:`txn_offsets.admin.grants`), and rendered as literals only for printing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, validate_identifier
from txn_offsets.errors import ConfigError
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import run_role_grants, tables_for

__all__ = [
    "PSEUDO_ROLES",
    "ROLE_ATTRIBUTES",
    "RoleCheck",
    "check_run_role",
    "job_role_grants",
    "owner_of",
    "owner_statement",
    "permitted",
    "require_reachable",
    "role_check",
    "role_refusal",
    "role_statements",
    "table_name",
    "validate_role",
    "warn_unconfined",
]

logger = logging.getLogger(__name__)

#: What a job's role may not be: no superuser, no DDL outside its grants, no row-level bypass.
ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"


#: Names that are no role of their own: PUBLIC (every role; GRANT ... TO "public" is PUBLIC too),
#: the role specifiers of GRANT and ALTER ROLE, and NONE (reserved). Lower case: validate_identifier
#: accepts nothing else.
PSEUDO_ROLES = frozenset({"public", "current_user", "current_role", "session_user", "none"})

_OWN_ROLE = "name the job's own role (`txn-offsets db role --role NAME --apply` creates one)"


def role_refusal(role: str) -> str | None:
    """Why `role` may not be made a job's role or be granted a run role's rights; None: it may.
    Pure: whether the role exists is asked of the database (:mod:`txn_offsets.admin.grants`)."""
    if role == "public":
        return f"'public' is PUBLIC, every role of the database (quoted or not), not one role: {_OWN_ROLE}"
    if role in PSEUDO_ROLES:
        return (
            f"{role!r} is a reserved word of PostgreSQL (CURRENT_USER, SESSION_USER, CURRENT_ROLE, "
            f"NONE), not a role of its own: {_OWN_ROLE}"
        )
    if role.startswith("pg_"):
        return (
            f"{role!r} is a predefined PostgreSQL role (every pg_* name is reserved): its members "
            f"would get the job's rights; {_OWN_ROLE}"
        )
    return None


def validate_role(role: str, what: str = "role") -> str:
    """`role` if it is a valid identifier and may be a job's role (:func:`role_refusal`), else a
    ConfigError naming `what` (the setting or option)."""
    name = validate_identifier(role, what)
    problem = role_refusal(name)
    if problem is not None:
        raise ConfigError(what, problem)
    return name


def _q(name: str) -> str:
    return f'"{name}"'


def table_name(name: str) -> tuple[str | None, str]:
    """``schema.table`` or ``table`` as validated (schema, table) identifiers."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) not in (1, 2):
        raise ConfigError("--table", f"{name!r}: give a result table as TABLE or SCHEMA.TABLE")
    try:
        checked = [validate_identifier(p, "--table") for p in parts]
    except ConfigError as exc:
        raise ConfigError("--table", f"{name!r}: {exc.problem}") from None
    return (None, checked[0]) if len(checked) == 1 else (checked[0], checked[1])


def job_role_grants(schema: str, role: str, tables: Sequence[str] = ()) -> list[str]:
    """:func:`run_role_grants` plus SELECT, INSERT, UPDATE on the job's result tables (an
    additive upsert reads the old value: ``ON CONFLICT DO UPDATE SET n = t.n + ...`` needs SELECT),
    and USAGE on their schemas. Never DELETE, never DDL; never to PUBLIC, a role specifier or a
    predefined role (:func:`validate_role`)."""
    stmts = run_role_grants(schema, validate_role(role))
    r = _q(role)
    for t in tables:
        tschema, table = table_name(t)
        if tschema is not None:
            usage = f"GRANT USAGE ON SCHEMA {_q(tschema)} TO {r}"
            if usage not in stmts:
                stmts.append(usage)
        target = _q(table) if tschema is None else f"{_q(tschema)}.{_q(table)}"
        stmts.append(f"GRANT SELECT, INSERT, UPDATE ON {target} TO {r}")
    return stmts


def owner_statement(schema: str, job: str, role: str) -> str:
    """The ``job_owners`` upsert as printable SQL (the job name rendered as a string literal;
    executing it uses bound values instead: :func:`txn_offsets.admin.grants.apply_grants`)."""
    s = _q(validate_identifier(schema, "schema"))
    values = "('" + job.replace("'", "''") + "', '" + validate_role(role) + "')"
    upsert = "ON CONFLICT (job) DO UPDATE SET role = EXCLUDED.role, granted_at = now()"
    return f"INSERT INTO {s}.job_owners (job, role) VALUES {values} {upsert}"  # noqa: S608 - printed only


def role_statements(role: str) -> list[str]:
    """Create the role if missing, then give it exactly :data:`ROLE_ATTRIBUTES` (idempotent).
    No password: it is set from TXN_OFFSETS_ROLE_PASSWORD by ``db role --apply`` (as a SCRAM
    verifier computed by the client) or with psql's ``\\password``. Refuses what
    :func:`role_refusal` refuses."""
    name = validate_role(role)
    return [
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{name}') "
        f"THEN CREATE ROLE {_q(name)}; END IF; END$$",
        f"ALTER ROLE {_q(name)} WITH {ROLE_ATTRIBUTES}",
    ]


@dataclass(frozen=True)
class RoleCheck:
    """Who a connection runs as, against the offset store of one schema."""

    role: str
    superuser: bool  # rolsuper or rolbypassrls: row-level security does not apply
    owner: bool  # a member of the tables' or the schema's owner: every job is reachable
    row_security: bool  # migration 0006 is in: job_reachable exists
    schema: str = ""  # the offset store's schema


def _function(db: DatabaseSettings) -> str:
    return f"{_q(db.schema)}.job_reachable"


def role_check(conn: sa.Connection, db: DatabaseSettings) -> RoleCheck:
    """One catalog query: the role, whether it is a superuser or the owner, and whether the
    schema has row-level security yet."""
    row = conn.execute(
        sa.text(
            "SELECT current_user AS role, r.rolsuper OR r.rolbypassrls AS superuser, "
            "coalesce(pg_has_role(c.relowner, 'USAGE') OR pg_has_role(n.nspowner, 'USAGE'), false) AS owner, "
            "to_regprocedure(:fn) IS NOT NULL AS rls "
            "FROM pg_catalog.pg_roles r "
            "LEFT JOIN pg_catalog.pg_class c ON c.oid = to_regclass(:jobs) "
            "LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE r.rolname = current_user"
        ),
        {"fn": f"{_function(db)}(text, text)", "jobs": f"{_q(db.schema)}.jobs"},
    ).one()
    return RoleCheck(str(row.role), bool(row.superuser), bool(row.owner), bool(row.rls), db.schema)


def _reachable(conn: sa.Connection, db: DatabaseSettings, job: str) -> bool:
    fn = sa.text(f"SELECT {_function(db)}(:job, current_user)")
    return bool(conn.execute(fn, {"job": job}).scalar_one())


def _not_permitted(role: str, job: str) -> ConfigError:
    return ConfigError(
        "database role",
        f"role {role!r} may not use job {job!r}: the job belongs to another role, or this role owns "
        f"other jobs and this one has no owner. Run the job as its own role, or give it to this one "
        f"as the schema owner: `txn-offsets db grants --job {job} --role {role} --apply`",
    )


def require_reachable(conn: sa.Connection, db: DatabaseSettings, job: str) -> None:
    """Raise a ConfigError naming the role, the job and the fix when row-level security hides
    `job` from this connection's role. Says nothing about whether the job exists."""
    check = role_check(conn, db)
    if not permitted(conn, db, check, job):
        raise _not_permitted(check.role, job)


def check_run_role(store: Store, job: str) -> RoleCheck:
    """At the start of a run: refuse a job the role may not use (before anything changes), and
    warn (one line) when the run is not confined to its job's rows: a superuser or the owner."""
    with store.engine.connect() as conn:
        check = role_check(conn, store.settings)
        if not permitted(conn, store.settings, check, job):
            raise _not_permitted(check.role, job)
    warn_unconfined(check, job)
    return check


def permitted(conn: sa.Connection, db: DatabaseSettings, check: RoleCheck, job: str) -> bool:
    """Whether `check`'s role may use `job`: row-level security lets it reach the job's rows."""
    return not check.row_security or check.superuser or check.owner or _reachable(conn, db, job)


def warn_unconfined(check: RoleCheck, job: str) -> None:
    """One warning line when a run of `job` is not confined to its rows (a superuser or the owner)."""
    if check.superuser or check.owner:
        what = "a superuser" if check.superuser else f"the owner of schema {check.schema!r}"
        logger.warning(
            "job %r runs as database role %r, %s: row-level security does not confine it to the "
            "job's rows; run jobs as a role of their own (`txn-offsets db role`, `db grants --job`)",
            job,
            check.role,
            what,
        )


def owner_of(conn: sa.Connection, db: DatabaseSettings, job: str) -> str | None:
    """The role that owns `job` (None: nobody). Needs SELECT on job_owners (the admin)."""
    owners = tables_for(db.schema).owners
    return conn.execute(sa.select(owners.c.role).where(owners.c.job == job)).scalar_one_or_none()
