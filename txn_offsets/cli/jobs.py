"""``txn-offsets jobs list|retire``: every job of the store, its generation and live run (over
:func:`txn_offsets.admin.views.list_jobs`), and retiring a job (over
:func:`txn_offsets.admin.retire.retire_job`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from txn_offsets.admin.retire import retire_job
from txn_offsets.admin.views import list_jobs
from txn_offsets.cli import options, output

__all__ = ["register"]


def _jobs(args: argparse.Namespace) -> int:
    db = options.database(args)
    with options.opened(db) as store:
        rows = list_jobs(store, include_retired=args.all)
    if args.format == "json":
        output.emit_json([{**asdict(r), "state": r.state} for r in rows])
        return 0
    output.table(
        ["JOB", "GENERATION", "STATE", "RUN", "HEARTBEAT_AGE_S", "PARTITIONS"],
        [
            (
                r.job,
                r.generation,
                r.state,
                r.run_id,
                None if r.heartbeat_age_s is None else f"{r.heartbeat_age_s:.1f}",
                r.partitions,
            )
            for r in rows
        ],
    )
    return 0


def _retire(args: argparse.Namespace) -> int:
    options.require_reason(args, "the job is retired")
    db = options.database(args)
    with options.opened(db) as store:
        done = retire_job(store, args.job, reason=args.reason, force=args.force, drop_rows=args.drop_rows)
    fenced = f"; live run {done.fenced_run} fenced" if done.fenced_run else ""
    if done.dropped:
        kept = (
            f"offsets, statistics, stream plan and lineage deleted, the audit and {done.dead_letters} dead "
            "letter(s) kept; a new run starts it as a new job"
        )
    else:
        kept = "offsets kept (`jobs list --all` shows it; a new run brings it back from them)"
    print(
        f"retired job {done.job!r} (generation now {done.generation}{fenced}): "
        f"{done.partitions} partition(s) audited, {kept}"
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="jobs, their generation and live run").add_subparsers(
        dest="jobs_command", required=True
    )
    listing = jobs.add_parser("list", parents=[options.store_options()], help="every job of the store")
    listing.add_argument("--all", action="store_true", help="retired jobs too")
    options.add_format(listing)
    listing.set_defaults(handler=_jobs)

    retire = jobs.add_parser(
        "retire",
        parents=[options.store_options()],
        help="take a job out of service (audited; `jobs list` hides it unless --all)",
    )
    retire.add_argument("--job", required=True)
    retire.add_argument("--reason", help="why (required; written to the audit table)")
    retire.add_argument(
        "--drop-rows",
        action="store_true",
        help="also delete its offsets, statistics, stream plan and lineage (default: keep them)",
    )
    retire.add_argument("--force", action="store_true", help="retire even while a live run holds the lease")
    retire.set_defaults(handler=_retire)
