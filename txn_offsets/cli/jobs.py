"""``txn-offsets jobs list``: every job of the store, its generation and live run (over
:func:`txn_offsets.admin.views.list_jobs`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from txn_offsets.admin.views import list_jobs
from txn_offsets.cli import options, output

__all__ = ["register"]


def _jobs(args: argparse.Namespace) -> int:
    db = options.database(args)
    with options.opened(db) as engine:
        rows = list_jobs(engine, db)
    if args.format == "json":
        output.emit_json([{**asdict(r), "state": "live" if r.live else "idle"} for r in rows])
        return 0
    output.table(
        ["JOB", "GENERATION", "STATE", "RUN", "HEARTBEAT_AGE_S", "PARTITIONS"],
        [
            (
                r.job,
                r.generation,
                "live" if r.live else "idle",
                r.run_id,
                None if r.heartbeat_age_s is None else f"{r.heartbeat_age_s:.1f}",
                r.partitions,
            )
            for r in rows
        ],
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="jobs, their generation and live run").add_subparsers(
        dest="jobs_command", required=True
    )
    listing = jobs.add_parser("list", parents=[options.store_options()], help="every job of the store")
    options.add_format(listing)
    listing.set_defaults(handler=_jobs)
