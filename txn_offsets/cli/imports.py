"""``txn-offsets offsets import``: bring a job's position from another offset store.

Parse, read the source, show the plan (always), then apply unless ``--dry-run``. The work behind
it is in :mod:`txn_offsets.admin.sources` (checkpoints, consumer groups, legacy tables) and
:mod:`txn_offsets.admin.imports` (plan and apply).

The plan says, per topic, what shows the source's offsets were taken in the topic's current
incarnation (:func:`txn_offsets.admin.sources.incarnation_evidence`). A legacy table cannot show it,
so ``--from-table`` without ``--topic-id``/``--current-topic-incarnation`` is a usage error (exit
64), refused before anything is read.
"""

from __future__ import annotations

import argparse

from txn_offsets.admin import sources
from txn_offsets.admin.imports import apply_import, plan_import
from txn_offsets.admin.sources import CURRENT_INCARNATION, TOPIC_ID, Incarnation
from txn_offsets.cli import exits, options, output
from txn_offsets.config import KafkaSettings, database_from_env
from txn_offsets.store.handle import Store

__all__ = ["register"]


def _topic_id(text: str) -> tuple[str, str]:
    """An argparse ``type``: TOPIC=ID (a Kafka topic id as kafka-topics.sh --describe shows it)."""
    topic, eq, topic_id = text.partition("=")
    if not eq or not topic.strip() or not topic_id.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give TOPIC=ID (the Kafka topic id)")
    return topic.strip(), topic_id.strip()


def _checked_options(args: argparse.Namespace) -> dict[str, str]:
    """The --topic-id values by topic; a usage error (code 64) for a topic named twice with two
    ids, a legacy table with neither flag (a table cannot show which incarnation its offsets are
    from), and the source options given to the wrong source. Checked before anything is read."""
    named: dict[str, str] = {}
    for topic, topic_id in args.topic_id or ():
        if named.setdefault(topic, topic_id) != topic_id:
            raise exits.UsageError(TOPIC_ID, f"{topic} is named twice, with {named[topic]} and {topic_id}")
    if args.checkpoint_batch is not None and not args.from_spark_checkpoint:
        raise exits.UsageError("--checkpoint-batch", "goes with --from-spark-checkpoint")
    for flag, value in (("--table-columns", args.table_columns), ("--table-filter", args.table_filter)):
        if value is not None and not args.from_table:
            raise exits.UsageError(flag, "goes with --from-table")
    column, eq, _ = (args.table_filter or "").partition("=")
    if args.table_filter is not None and not (eq and column):
        raise exits.UsageError("--table-filter", f"{args.table_filter!r}: give COLUMN=VALUE")
    if args.from_table and not named and not args.current_topic_incarnation:
        raise exits.UsageError(
            "--from-table",
            f"a table does not say which incarnation of its topics the offsets were "
            f"taken in (a topic deleted and re-created since has a new topic id, its offsets "
            f"starting again at 0): add {TOPIC_ID} TOPIC=ID for each topic (checked against Kafka's "
            f"current id), or {CURRENT_INCARNATION} if they were taken in the current topics",
        )
    return named


def _source(args: argparse.Namespace, store: Store, kafka: KafkaSettings) -> sources.Source:
    if args.from_spark_checkpoint:
        return sources.from_checkpoint(args.from_spark_checkpoint, batch=args.checkpoint_batch)
    if args.from_consumer_group:
        return sources.from_consumer_group(kafka, args.from_consumer_group)
    columns = args.table_columns.split(",") if args.table_columns else None
    column, _, value = (args.table_filter or "").partition("=")
    where = (column, value) if args.table_filter else None
    return sources.from_table(store, args.from_table, columns=columns, where=where)


def _import(args: argparse.Namespace) -> int:
    topic_ids = _checked_options(args)
    db = database_from_env(schema=args.schema)
    kafka = options.kafka(args)
    with options.opened(db) as store, output.progress("import", total=3) as bar:
        source = _source(args, store, kafka)
        bar.advance(note=f"read {len(source.offsets)} offset(s) from {source.name}")
        plan = plan_import(
            store,
            args.job,
            source.offsets,
            source=source.name,
            kafka=kafka,
            topics=args.topic or (),
            allow_outside_log=args.allow_outside_log,
            incarnation=Incarnation.of(source, topic_ids=topic_ids, current=args.current_topic_incarnation),
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
        for topic, found in plan.evidence.items():
            print(f"incarnation of {topic}: {found}")
        for note in plan.notes():
            print(f"note: {note}")
        if plan.unchanged:  # nothing to write: no --force, no audit row, no new generation
            print(
                f"job {plan.job!r} already has exactly these offsets, of the same topic incarnation(s): "
                f"nothing to import, nothing changed"
            )
            return 0
        if not output.confirm_move(plan, action="import", dry_run=args.dry_run, force=args.force):
            return 0
        generation = apply_import(store, plan, reason=args.reason, force=args.force)
        bar.advance(note="written")
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
    word = cmd.add_mutually_exclusive_group()
    word.add_argument(
        TOPIC_ID,
        action="append",
        type=_topic_id,
        metavar="TOPIC=ID",
        help="the Kafka topic id TOPIC had when the source's offsets were taken (repeatable); refused "
        "unless it is the current one. Needed for a table; overrides a checkpoint's time check",
    )
    word.add_argument(
        CURRENT_INCARNATION,
        action="store_true",
        help="the source's offsets were taken in the topics as they are now (not deleted and "
        "re-created since); needed for a table without --topic-id; audited",
    )
    options.add_kafka_bootstrap(cmd)
    cmd.set_defaults(handler=_import)
