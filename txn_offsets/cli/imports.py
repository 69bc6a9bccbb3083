"""``txn-offsets offsets import``: bring a job's position from another offset store.

Parse, read the source, show the plan (always), then apply unless ``--dry-run``. The work behind
it is in :mod:`txn_offsets.admin.sources` (checkpoints, consumer groups, legacy tables) and
:mod:`txn_offsets.admin.imports` (plan and apply).
"""

from __future__ import annotations

import argparse

import sqlalchemy as sa

from txn_offsets.admin import sources
from txn_offsets.admin.imports import apply_import, plan_import
from txn_offsets.cli import options, output
from txn_offsets.config import DatabaseSettings, KafkaSettings, database_from_env
from txn_offsets.errors import ConfigError
from txn_offsets.store.database import engine_for

__all__ = ["register"]


def _source(
    args: argparse.Namespace, engine: sa.Engine, db: DatabaseSettings, kafka: KafkaSettings
) -> sources.Source:
    if args.from_spark_checkpoint:
        return sources.from_checkpoint(args.from_spark_checkpoint, batch=args.checkpoint_batch)
    if args.checkpoint_batch is not None:
        raise ConfigError("--checkpoint-batch", "goes with --from-spark-checkpoint")
    if args.from_consumer_group:
        return sources.from_consumer_group(kafka, args.from_consumer_group)
    columns = args.table_columns.split(",") if args.table_columns else None
    where = None
    if args.table_filter:
        column, eq, value = args.table_filter.partition("=")
        if not eq or not column:
            raise ConfigError("--table-filter", f"{args.table_filter!r}: give COLUMN=VALUE")
        where = (column, value)
    return sources.from_table(engine, db, args.from_table, columns=columns, where=where)


def _import(args: argparse.Namespace) -> int:
    db = database_from_env(schema=args.schema)
    kafka = options.kafka(args)
    engine = engine_for(db)
    try:
        with output.progress("import", total=3) as bar:
            source = _source(args, engine, db, kafka)
            bar.advance(note=f"read {len(source.offsets)} offset(s) from {source.name}")
            plan = plan_import(
                engine,
                db,
                args.job,
                source.offsets,
                source=source.name,
                kafka=kafka,
                topics=args.topic or (),
                allow_outside_log=args.allow_outside_log,
            )
            bar.advance(note="checked against Kafka and the store")
            gen = "new job" if plan.generation is None else f"generation {plan.generation}"
            output.print_moves(
                f"import plan for job {plan.job!r} ({gen}) from {plan.source}:",
                plan.steps,
                detail=lambda s: f"  (log {s.log_start}..{s.end})",
            )
            for topic, parts in plan.not_imported.items():
                print(f"  {topic}  not imported ({parts} partition(s) in the source)")
            for note in plan.notes():
                print(f"note: {note}")
            if not output.confirm_move(plan, action="import", dry_run=args.dry_run, force=args.force):
                return 0
            generation = apply_import(engine, db, plan, reason=args.reason, force=args.force)
            bar.advance(note="written")
    finally:
        engine.dispose()
    print(f"imported {len(plan.steps)} partition(s) into job {plan.job!r}; generation is now {generation}")
    return 0


def register(
    offsets: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    cmd = offsets.add_parser(
        "import",
        parents=[common],
        help="take a job's offsets from a Spark checkpoint, a consumer group or a legacy table (audited)",
    )
    cmd.add_argument("--job", required=True)
    src = cmd.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--from-spark-checkpoint", metavar="DIR", help="a Structured Streaming checkpointLocation"
    )
    src.add_argument(
        "--from-consumer-group", metavar="GROUP", help="a Kafka consumer group's committed offsets"
    )
    src.add_argument(
        "--from-table", metavar="SCHEMA.TABLE", help="a (topic, partition, offset) table in this database"
    )
    cmd.add_argument(
        "--topic",
        action="append",
        metavar="T",
        help="import this topic of the source (repeatable; default: the job's own topics, or the "
        "source's only topic; a source of several topics needs it for a new job)",
    )
    cmd.add_argument(
        "--checkpoint-batch",
        type=options.integer(),
        metavar="ID",
        help="take the offsets of this batch (needed when the last batch was planned but not committed)",
    )
    cmd.add_argument(
        "--table-columns", metavar="TOPIC,PARTITION,OFFSET", help="the legacy table's column names"
    )
    cmd.add_argument(
        "--table-filter", metavar="COLUMN=VALUE", help="only the legacy table's rows where COLUMN = VALUE"
    )
    cmd.add_argument("--reason", help="why (written to the audit table with the source)")
    cmd.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    cmd.add_argument("--force", action="store_true", help="replace offsets the job has; fence a live run")
    cmd.add_argument(
        "--allow-outside-log",
        action="store_true",
        help="import offsets outside [log start, end] anyway (refused otherwise); audited",
    )
    options.add_kafka_bootstrap(cmd)
    cmd.set_defaults(handler=_import)
