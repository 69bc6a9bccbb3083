"""``txn-offsets db``: create, migrate and check the offset store's tables; print or apply the
GRANTs of a run role (``grants``, per job with ``--job``) and the statements of a job's role
(``role``). A thin layer over :mod:`txn_offsets.store.migrate` and :mod:`txn_offsets.admin.grants`."""

from __future__ import annotations

import argparse
import os

from txn_offsets.admin import grants
from txn_offsets.cli import exits, options
from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate
from txn_offsets.store.roles import job_role_grants, owner_statement, role_statements
from txn_offsets.store.runs import validate_job

PASSWORD_ENV = "TXN_OFFSETS_ROLE_PASSWORD"  # noqa: S105 - the variable's name, not a password

__all__ = ["register"]


#: What each action takes beyond --schema; anything else given to it is a usage error.
_TAKES = {
    "upgrade": {"revision"},
    "downgrade": {"revision"},
    "current": set(),
    "check": set(),
    "grants": {"role", "job", "table", "apply"},
    "role": {"role", "apply"},
}


def _checked(args: argparse.Namespace) -> None:
    """Usage errors (code 64) found after parsing, before anything is printed or connected: an
    option the action does not take, a missing revision or role."""
    for name in ("role", "job", "table", "apply", "revision"):
        if getattr(args, name) and name not in _TAKES[args.action]:
            flag = "revision" if name == "revision" else f"--{name}"
            takers = " and ".join(f"`db {a}`" for a, takes in _TAKES.items() if name in takes)
            raise exits.UsageError(flag, f"goes with {takers}, not `db {args.action}`")
    if args.action == "downgrade" and not args.revision:
        raise exits.UsageError("revision", "give the revision to go down to (`base` removes every table)")
    if (
        args.action in ("upgrade", "downgrade")
        and args.revision
        and not migrate.known_revision(args.revision)
    ):
        raise exits.UsageError(
            "revision",
            f"{args.revision!r} names no single revision of the migrations (the newest is {migrate.head()})",
        )
    if args.action in ("grants", "role") and not args.role:
        what = "the role the jobs run as" if args.action == "grants" else "the role to create or update"
        raise exits.UsageError("--role", f"name {what}")


def _statements(args: argparse.Namespace) -> list[str]:
    """The statements of `args.action`, built from validated names: a malformed --role, --table,
    --job or --schema, or a role that is no role of its own (PUBLIC, a reserved word, a predefined
    pg_* role), is a usage error (code 64), found before anything is printed or connected."""
    try:
        if args.action == "role":
            return role_statements(args.role)
        schema = args.schema or "txn_offsets"
        stmts = job_role_grants(schema, args.role, args.table)
        if args.job is not None:
            validate_job(args.job)
            stmts.append(owner_statement(schema, args.job, args.role))
        return stmts
    except ConfigError as exc:
        raise exits.UsageError.of(exc) from None


def _grants(args: argparse.Namespace) -> int:
    stmts = _statements(args)
    if not args.apply:
        print("\n".join(f"{stmt};" for stmt in stmts))
        return 0
    db = options.database(args)
    with options.opened(db) as store:
        done = grants.apply_grants(store, args.role, job=args.job, tables=args.table)
    print(f"role {args.role!r}: {done.statements} statement(s) applied in schema {db.schema!r}")
    if args.job is not None:
        was = "no owner" if done.previous_owner is None else f"owner {done.previous_owner!r}"
        print(f"job {args.job!r} is owned by {args.role!r} (before: {was})")
    return 0


def _role(args: argparse.Namespace) -> int:
    stmts = _statements(args)
    if not args.apply:
        print("\n".join(f"{stmt};" for stmt in stmts))
        print(
            f"-- then set its password: \\password {args.role} in psql, or --apply with ${PASSWORD_ENV} set"
        )
        return 0
    raw = os.environ.get(PASSWORD_ENV)
    db = options.database(args)
    with options.opened(db) as store:
        created = grants.apply_role(store, args.role, Secret(raw) if raw else None)
    state = "created" if created else "updated"
    print(f"role {args.role!r} {state}{' with the password from $' + PASSWORD_ENV if raw else ''}")
    return 0


def _db_cmd(args: argparse.Namespace) -> int:
    _checked(args)
    if args.action == "grants":
        return _grants(args)
    if args.action == "role":
        return _role(args)
    db = options.database(args)
    if args.action == "upgrade":
        print(f"schema {db.schema!r} is at revision {migrate.upgrade(db, args.revision or 'head')}")
    elif args.action == "downgrade":
        print(f"schema {db.schema!r} is at revision {migrate.downgrade(db, args.revision)}")
    elif args.action == "current":
        rev = migrate.current(db)
        head = migrate.head(db)
        state = "not created" if rev is None else ("head" if rev == head else f"behind head {head}")
        print(f"schema {db.schema!r}: revision {rev} ({state})")
    else:
        migrate.check(db)
        print(f"schema {db.schema!r} is at head and matches the models")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser(
        "db", parents=[options.store_options()], help="create, migrate and check the offset store's tables"
    )
    db.add_argument("action", choices=["upgrade", "downgrade", "current", "check", "grants", "role"])
    db.add_argument(
        "--role",
        help="grants, role: the role a job runs as (no DDL; its one DELETE is of its own jobs' expired "
        "lineage, the commits rows its runs prune)",
    )
    db.add_argument("--job", help="grants: make ROLE the owner of this job (row-level security)")
    db.add_argument(
        "--table",
        action="append",
        default=[],
        help="grants: a result table of the job, TABLE or SCHEMA.TABLE (repeatable): SELECT, INSERT, UPDATE",
    )
    db.add_argument(
        "--apply",
        action="store_true",
        help=f"grants, role: run the statements (default: print them); role takes ${PASSWORD_ENV}",
    )
    db.add_argument(
        "revision", nargs="?", help="target revision (upgrade: default head; downgrade: required)"
    )
    db.set_defaults(handler=_db_cmd)
