"""Where an import takes a job's offsets from: each source gives ``{(topic, partition): next offset
to read}`` and the name the plan and the audit rows give it.

A Structured Streaming checkpoint (:mod:`txn_offsets.admin.checkpoint`), a Kafka consumer group
(:func:`txn_offsets.kafka.mirror.group_offsets`) or a legacy ``(topic, partition, offset)`` table
(:func:`read_table`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from txn_offsets.admin.checkpoint import read_checkpoint
from txn_offsets.config import DatabaseSettings, KafkaSettings, validate_identifier
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.database import translate_errors

__all__ = ["Source", "from_checkpoint", "from_consumer_group", "from_table", "read_table"]

_PARTITION_NAMES = ("partition", "part", "partition_id", "kafka_partition")
_OFFSET_NAMES = ("offset", "off", "until_offset", "next_offset", "kafka_offset")


@dataclass(frozen=True)
class Source:
    """The offsets read from a source, and its name (shown with the plan, written to the audit)."""

    name: str
    offsets: dict[TopicPartition, int]


def from_checkpoint(checkpoint: str | Path, *, batch: int | None = None) -> Source:
    """The offsets a Structured Streaming query's checkpoint directory continues from (see
    :func:`txn_offsets.admin.checkpoint.read_checkpoint` for `batch`), named as given."""
    found = read_checkpoint(Path(checkpoint), batch=batch)
    return Source(f"spark checkpoint {checkpoint} (batch {found.batch})", dict(found.offsets))


def from_consumer_group(kafka: KafkaSettings, group: str) -> Source:
    """The committed offsets of a Kafka consumer group; a group without any is an error."""
    offsets = group_offsets(kafka, group)
    if not offsets:
        raise ConfigError(
            "--from-consumer-group",
            f"group {group!r} has no committed offsets on {kafka.bootstrap_servers} "
            f"(check the name: kafka-consumer-groups.sh --list)",
        )
    return Source(f"consumer group {group!r}", offsets)


def from_table(
    engine: sa.Engine,
    db: DatabaseSettings,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    where: tuple[str, str] | None = None,
) -> Source:
    """The offsets of a legacy table (see :func:`read_table`)."""
    return Source(f"table {table}", read_table(engine, db, table, columns=columns, where=where))


def _ident(value: str, what: str) -> str:
    return validate_identifier(value, what)


def read_table(
    engine: sa.Engine,
    db: DatabaseSettings,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    where: tuple[str, str] | None = None,
) -> dict[TopicPartition, int]:
    """Offsets from a legacy table ``SCHEMA.TABLE`` with a topic, a partition and an offset column
    (the NEXT offset to read). `columns` names them (default: found by name); `where` keeps the
    rows whose column equals a value (e.g. one job's rows of a shared table)."""
    schema, dot, name = table.partition(".")
    if not dot:
        raise ConfigError("--from-table", f"{table!r}: give SCHEMA.TABLE")
    _ident(schema, "--from-table schema")
    _ident(name, "--from-table table")
    with translate_errors(db), engine.connect() as conn:
        try:
            found = [c["name"] for c in sa.inspect(conn).get_columns(name, schema=schema)]
        except sa.exc.NoSuchTableError:
            found = []
        if not found:
            raise ConfigError(
                "--from-table", f"{table} does not exist or has no columns visible to this role"
            )
        if columns is None:
            pick = [
                next((c for c in found if c == "topic"), None),
                next((c for n in _PARTITION_NAMES for c in found if c == n), None),
                next((c for n in _OFFSET_NAMES for c in found if c == n), None),
            ]
            if None in pick:
                raise ConfigError(
                    "--table-columns",
                    f"{table} has columns {', '.join(found)}: name them as TOPIC,PARTITION,OFFSET",
                )
            cols = [str(c) for c in pick]
        else:
            cols = [_ident(c, "--table-columns") for c in columns]
            missing = [c for c in cols if c not in found]
            if len(cols) != 3 or missing:
                raise ConfigError(
                    "--table-columns", f"give three of the columns of {table}: {', '.join(found)}"
                )
        src = sa.table(name, *(sa.column(c) for c in {*cols, *([where[0]] if where else [])}), schema=schema)
        stmt = sa.select(src.c[cols[0]], src.c[cols[1]], src.c[cols[2]])
        if where is not None:
            if _ident(where[0], "--table-filter column") not in found:
                raise ConfigError("--table-filter", f"{table} has no column {where[0]!r}")
            stmt = stmt.where(sa.cast(src.c[where[0]], sa.Text) == where[1])
        out: dict[TopicPartition, int] = {}
        for topic, part, off in conn.execute(stmt):
            key = (str(topic), int(part))
            if key in out and out[key] != int(off):
                raise ConfigError(
                    "--from-table",
                    f"{table} has two offsets for {key[0]}[{key[1]}]; filter with --table-filter",
                )
            out[key] = int(off)
    if not out:
        raise ConfigError("--from-table", f"{table} has no rows{' matching the filter' if where else ''}")
    return out
