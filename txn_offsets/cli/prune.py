"""``txn-offsets offsets prune``: a job's lineage (or every retired job's) pruned by count or by
age, audited; over :func:`txn_offsets.admin.prune.prune_lineage`."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from txn_offsets.admin.prune import prune_lineage, retired_jobs
from txn_offsets.cli import options, output

__all__ = ["register"]


def _prune(args: argparse.Namespace) -> int:
    options.require_reason(args, "the lineage is pruned")
    db = options.database(args)
    rule = f"newest {args.keep} per partition kept" if args.keep else None
    if rule is None:
        days = (args.older_than or db.lineage_retention_days * 86400.0) / 86400
        rule = f"older than {days:g} day(s)" + ("" if args.older_than else " (the retention)")
    with options.opened(db) as store:
        jobs = retired_jobs(store) if args.retired else [args.job]
        done = [
            prune_lineage(store, job, reason=args.reason, keep=args.keep, older_than_s=args.older_than)
            for job in jobs
        ]
    if args.format == "json":
        output.emit_json([asdict(p) for p in done])
        return 0
    if args.retired and not done:
        print("no retired job: nothing pruned")
    for p in done:
        print(f"pruned {p.deleted} commits row(s) of job {p.job!r} ({p.partitions} partition(s)): {rule}")
    return 0


def register(
    offsets: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    prune = offsets.add_parser(
        "prune",
        parents=[common],
        help="delete old lineage (commits rows) of a job or of every retired job (audited)",
    )
    which = prune.add_mutually_exclusive_group(required=True)
    which.add_argument("--job")
    which.add_argument("--retired", action="store_true", help="every retired job (`jobs list --all`)")
    rule = prune.add_mutually_exclusive_group()
    rule.add_argument(
        "--keep",
        type=options.integer(1),
        metavar="N",
        help="keep the newest N rows of each partition",
    )
    rule.add_argument(
        "--older-than",
        type=options.duration,
        metavar="DUR",
        help="delete rows committed longer ago than DUR (e.g. 30d, 12h, 90m, 3600s; default: the "
        "lineage retention, 30d)",
    )
    prune.add_argument("--reason", help="why (required; written to the audit table)")
    options.add_format(prune)
    prune.set_defaults(handler=_prune)
