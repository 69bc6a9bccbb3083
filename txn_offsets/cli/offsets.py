"""``txn-offsets offsets``: show, reset, lag, import, history, explain and prune of a job's offsets.

A thin layer over :mod:`txn_offsets.admin`: parse, call, print. ``offsets import`` and ``offsets
prune`` have their own modules (:mod:`txn_offsets.cli.imports`, :mod:`txn_offsets.cli.prune`). A
reset always shows its plan first (:func:`txn_offsets.admin.reset.plan_reset`), then applies it
unless ``--dry-run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import asdict

from txn_offsets.admin.lag import PartitionLag, offset_lag
from txn_offsets.admin.lineage import explain, partition_history
from txn_offsets.admin.reset import OffsetOutOfRange, ResetTarget, apply_reset, plan_reset
from txn_offsets.admin.views import audit_log, show_offsets
from txn_offsets.cli import exits, imports, options, output, prune
from txn_offsets.errors import ConfigError

__all__ = ["register"]


def _show(args: argparse.Namespace) -> int:
    db = options.database(args)
    with options.opened(db) as store:
        rows = show_offsets(store, args.job)
    if args.format == "json":
        output.emit_json([asdict(r) for r in rows])
        return 0
    output.table(
        ["JOB", "TOPIC", "PARTITION", "OFFSET", "UPDATED"],
        [(r.job, r.topic, r.partition, r.offset, r.updated_at.isoformat(timespec="seconds")) for r in rows],
    )
    return 0


def _target(args: argparse.Namespace) -> ResetTarget:
    if args.to_earliest:
        return ResetTarget("earliest")
    if args.to_latest:
        return ResetTarget("latest")
    if args.to_offset is not None:
        return ResetTarget("offset", value=args.to_offset)
    if args.shift_by is not None:
        return ResetTarget("shift", value=args.shift_by)
    return ResetTarget("datetime", at=args.to_datetime)


def _reset(args: argparse.Namespace) -> int:
    if not args.dry_run:
        options.require_reason(args, "the offsets move")
    if args.partition and args.topic is None:
        raise exits.UsageError("--partition", "needs --topic")
    db = options.database(args)
    target = dataclasses.replace(_target(args), allow_outside_log=args.allow_outside_log)
    try:  # with --allow-outside-log, Kafka (when known) still says what was forced
        kafka = options.kafka(args)
    except ConfigError:
        if target.needs_kafka:
            raise
        kafka = None
    with options.opened(db) as store:
        try:
            plan = plan_reset(
                store, args.job, target, topic=args.topic, partitions=args.partition or (), kafka=kafka
            )
        except OffsetOutOfRange as exc:  # the shift's arithmetic: a wrong argument, in a dry run too
            raise exits.UsageError.of(exc) from None
        output.print_moves(f"reset plan for job {plan.job!r} (generation {plan.generation}):", plan.steps)
        for note in plan.notes():
            print(f"note: {note}")
        if not output.confirm_move(plan, action="reset", dry_run=args.dry_run, force=args.force):
            return 0
        generation = apply_reset(store, plan, reason=args.reason, force=args.force)
    print(f"reset {len(plan.steps)} partition(s) of job {plan.job!r}; generation is now {generation}")
    return 0


def _note(p: PartitionLag) -> str:
    if p.offset is None:
        return "new partition (starts at the log start)"
    if p.lost:
        return f"OUT_OF_LOG: {p.lost} offsets deleted before processing"
    if p.out_of_log:
        bounds = f"[{p.log_start}, {p.end}]"
        return f"OUT_OF_LOG: past the end of the log {bounds}; the next run finds data loss there"
    return ""


def _lag(args: argparse.Namespace) -> int:
    db = options.database(args)
    kafka = options.kafka(args)
    with options.opened(db) as store:
        report = offset_lag(store, args.job, kafka)
    if args.format == "json":
        output.emit_json(report.as_dict())
    else:
        output.table(
            ["TOPIC", "PARTITION", "OFFSET", "END", "LAG", "LAG_S", "NOTE"],
            [
                (
                    p.topic,
                    p.partition,
                    p.offset,
                    p.end,
                    p.lag,
                    None if p.lag_seconds is None else f"{p.lag_seconds:.1f}",
                    _note(p),
                )
                for p in report.partitions
            ],
        )
        oldest = report.max_lag_seconds
        print(
            f"total lag of job {report.job!r}: {report.total} offsets over {len(report.partitions)} "
            f"partition(s) (end offsets at {report.isolation_level})"
            + ("" if oldest is None else f"; oldest unprocessed record {oldest:.1f}s old")
            + (f"; {report.out_of_log} partition(s) OUT_OF_LOG" if report.out_of_log else "")
        )
    if args.fail_over is not None and report.out_of_log:
        print(
            f"txn-offsets: job {report.job!r} has {report.out_of_log} partition(s) whose stored offset "
            f"is outside the log (OUT_OF_LOG): its next run finds data loss there",
            file=sys.stderr,
        )
        return exits.NOT_OK
    if args.fail_over is not None and report.total > args.fail_over:
        print(
            f"txn-offsets: lag of job {report.job!r} is {report.total} offsets, over --fail-over "
            f"{args.fail_over}",
            file=sys.stderr,
        )
        return exits.NOT_OK
    return 0


def _timeline(args: argparse.Namespace) -> int:
    """History of some partitions: their commits (the lineage) and audited moves, newest first."""
    db = options.database(args)
    with options.opened(db) as store:
        rows = partition_history(
            store, args.job, topic=args.topic, partition=args.partition, limit=args.limit
        )
    if args.format == "json":
        output.emit_json([asdict(r) for r in rows])
        return 0
    output.table(
        ["AT", "TOPIC", "PARTITION", "FROM", "UNTIL", "ACTION", "GEN", "BY", "BATCH", "DETAIL"],
        [
            (
                r.at.isoformat(timespec="seconds"),
                r.topic,
                r.partition,
                r.old,
                r.new,
                r.action,
                r.generation,
                r.actor,
                r.batch,
                r.reason
                if r.action != "commit"
                else None
                if r.first_record_at is None or r.last_record_at is None
                else f"records {r.first_record_at.isoformat(timespec='seconds')}"
                f"..{r.last_record_at.isoformat(timespec='seconds')}",
            )
            for r in rows
        ],
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    db = options.database(args)
    with options.opened(db) as store:
        answer = explain(store, args.job, topic=args.topic, partition=args.partition, offset=args.offset)
    if args.format == "json":
        output.emit_json(asdict(answer))
    else:
        print(answer.message())
    return 0


def _history(args: argparse.Namespace) -> int:
    if args.topic is not None or args.partition is not None:
        return _timeline(args)
    db = options.database(args)
    with options.opened(db) as store:
        rows = audit_log(store, args.job, limit=args.limit)
    if args.format == "json":
        output.emit_json([asdict(r) for r in rows])
        return 0
    output.table(
        ["AT", "TOPIC", "PARTITION", "OLD", "NEW", "ACTION", "ACTOR", "REASON"],
        [
            (
                r.at.isoformat(timespec="seconds"),
                r.topic,
                r.partition,
                r.old,
                r.new,
                r.action,
                r.actor,
                r.reason,
            )
            for r in rows
        ],
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = options.store_options()
    offsets = sub.add_parser("offsets", help="show or reset stored offsets").add_subparsers(
        dest="offsets_command", required=True
    )
    show = offsets.add_parser("show", parents=[common], help="the stored offsets (all jobs, or --job)")
    show.add_argument("--job")
    options.add_format(show)
    show.set_defaults(handler=_show)

    reset = offsets.add_parser("reset", parents=[common], help="move a job's offsets (audited)")
    reset.add_argument("--job", required=True)
    reset.add_argument("--topic", help="only this topic (default: every topic the job has offsets for)")
    reset.add_argument(
        "--partition",
        type=options.integer(0, options.INT_MAX),
        action="append",
        help="only this partition (repeatable)",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset (asks Kafka)")
    to.add_argument("--to-latest", action="store_true", help="the end offset, as readers see it (asks Kafka)")
    to.add_argument(
        "--to-datetime",
        type=options.aware_datetime,
        metavar="ISO8601",
        help="first offset at/after this time, with its timezone (asks Kafka)",
    )
    to.add_argument("--to-offset", type=options.integer(), metavar="N")
    to.add_argument(
        "--shift-by",
        type=options.integer(-options.BIGINT_MAX),
        metavar="N",
        help="move by N (negative: re-process)",
    )
    reset.add_argument("--reason", help="why (written to the audit table; required unless --dry-run)")
    reset.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    reset.add_argument("--force", action="store_true", help="reset even while a live run holds the lease")
    reset.add_argument(
        "--allow-outside-log",
        action="store_true",
        help="move outside [log start, end] (refused for --to-offset, clamped for --shift-by); audited",
    )
    options.add_kafka_bootstrap(reset)
    reset.set_defaults(handler=_reset)

    lag = offsets.add_parser(
        "lag", parents=[common], help="per partition: stored offset, end offset (LSO) and lag"
    )
    lag.add_argument("--job", required=True)
    options.add_kafka_bootstrap(lag)
    options.add_format(lag)
    lag.add_argument(
        "--fail-over",
        type=options.integer(),
        metavar="N",
        help="exit with code 3 when the total lag is over N offsets (for scripts and probes)",
    )
    lag.set_defaults(handler=_lag)

    imports.register(offsets, common)
    prune.register(offsets, common)

    history = offsets.add_parser(
        "history",
        parents=[common],
        help="the audit log of a job, newest first; with --topic/--partition: their commits too",
    )
    history.add_argument("--job", required=True)
    history.add_argument("--topic", help="this topic's commits (lineage) and audited moves")
    history.add_argument(
        "--partition",
        type=options.integer(0, options.INT_MAX),
        help="this partition's commits (lineage) and audited moves",
    )
    history.add_argument(
        "--limit", type=options.integer(1, 1_000_000), default=50, help="the newest N rows (default: 50)"
    )
    options.add_format(history)
    history.set_defaults(handler=_history)

    why = offsets.add_parser(
        "explain", parents=[common], help="which run and batch committed a record, or why none did"
    )
    why.add_argument("--job", required=True)
    why.add_argument("--topic", required=True)
    why.add_argument("--partition", required=True, type=options.integer(0, options.INT_MAX))
    why.add_argument("--offset", required=True, type=options.integer(0), metavar="N")
    options.add_format(why)
    why.set_defaults(handler=_explain)
