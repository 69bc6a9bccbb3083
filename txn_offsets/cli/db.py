"""``txn-offsets db``: create, migrate and check the offset store's tables, and print the GRANTs
of the run role. A thin layer over :mod:`txn_offsets.store.migrate`: parse, call, print."""

from __future__ import annotations

import argparse

from txn_offsets.cli import options
from txn_offsets.errors import ConfigError
from txn_offsets.store import migrate
from txn_offsets.store.schema import run_role_grants

__all__ = ["register"]


def _db_cmd(args: argparse.Namespace) -> int:
    if args.action == "grants":
        if not args.role:
            raise ConfigError("--role", "name the role the jobs run as")
        schema = args.schema or "txn_offsets"
        print("\n".join(f"{stmt};" for stmt in run_role_grants(schema, args.role)))
        return 0
    db = options.database(args)
    if args.action == "upgrade":
        print(f"schema {db.schema!r} is at revision {migrate.upgrade(db, args.revision or 'head')}")
    elif args.action == "downgrade":
        if not args.revision:
            raise ConfigError("revision", "give the revision to go down to (`base` removes every table)")
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
    db.add_argument("action", choices=["upgrade", "downgrade", "current", "check", "grants"])
    db.add_argument("--role", help="grants: the role the jobs run as (no DDL, no DELETE)")
    db.add_argument(
        "revision", nargs="?", help="target revision (upgrade: default head; downgrade: required)"
    )
    db.set_defaults(handler=_db_cmd)
