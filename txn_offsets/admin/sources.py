"""Where an import takes a job's offsets from: each source gives ``{(topic, partition): next offset
to read}`` and the name the plan and the audit rows give it.

A Structured Streaming checkpoint (:mod:`txn_offsets.admin.checkpoint`), a Kafka consumer group
(:func:`txn_offsets.kafka.mirror.group_offsets`) or a legacy ``(topic, partition, offset)`` table
(:func:`read_table`).

Each source also says what it knows of the topic incarnation its offsets were taken in, and
:func:`incarnation_evidence` decides per topic whether that is the current one, or refuses (the
rules: :mod:`txn_offsets.admin.imports`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from txn_offsets.admin.checkpoint import SETTING as CHECKPOINT
from txn_offsets.admin.checkpoint import read_checkpoint
from txn_offsets.config import KafkaSettings, validate_identifier
from txn_offsets.errors import ConfigError
from txn_offsets.kafka import metadata
from txn_offsets.kafka.described import TopicInfo
from txn_offsets.kafka.mirror import group_offsets
from txn_offsets.kafka.timestamps import first_timestamps
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.handle import Store

__all__ = [
    "CURRENT_INCARNATION",
    "TOPIC_ID",
    "Incarnation",
    "Source",
    "batch_time",
    "from_checkpoint",
    "from_consumer_group",
    "from_table",
    "incarnation_evidence",
    "read_table",
]

#: The operator's word on the topic incarnation a source's offsets were taken in.
TOPIC_ID = "--topic-id"
CURRENT_INCARNATION = "--current-topic-incarnation"

_PARTITION_NAMES = ("partition", "part", "partition_id", "kafka_partition")
_OFFSET_NAMES = ("offset", "off", "until_offset", "next_offset", "kafka_offset")


@dataclass(frozen=True)
class Source:
    """The offsets read from a source, its name (shown with the plan, written to the audit) and
    what it knows of the topic incarnation they were taken in: `written_at_ms`, when they were
    taken (ms since the epoch; every record before them existed by then), or
    `dropped_with_topic`, Kafka deletes them with their topic. Neither: the source cannot tell."""

    name: str
    offsets: dict[TopicPartition, int]
    written_at_ms: int | None = None
    dropped_with_topic: bool = False


def from_checkpoint(checkpoint: str | Path, *, batch: int | None = None) -> Source:
    """The offsets a Structured Streaming query's checkpoint directory continues from (see
    :func:`txn_offsets.admin.checkpoint.read_checkpoint` for `batch`), named as given, with the
    batch's time."""
    found = read_checkpoint(Path(checkpoint), batch=batch)
    return Source(
        f"spark checkpoint {checkpoint} (batch {found.batch})",
        dict(found.offsets),
        written_at_ms=batch_time(Path(checkpoint), found.batch),
    )


def batch_time(checkpoint: Path, batch: int) -> int | None:
    """The ``batchTimestampMs`` (> 0) of batch `batch`'s offsets file (line 2, the metadata), or None.

    Spark asks its sources for their latest offsets first and stamps the batch after
    (MicroBatchExecution.constructNextBatch): every record before the batch's offsets had been
    written by this time, in the topic incarnation the query read."""
    path = checkpoint / "offsets" / str(batch)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        raise ConfigError(CHECKPOINT, f"{path}: line 2 (the batch metadata) is not JSON") from None
    value = meta.get("batchTimestampMs") if isinstance(meta, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None  # an older or hand-made checkpoint: the import then needs the operator's word
    return value


def from_consumer_group(kafka: KafkaSettings, group: str) -> Source:
    """The committed offsets of a Kafka consumer group; a group without any is an error."""
    offsets = group_offsets(kafka, group)
    if not offsets:
        raise ConfigError(
            "--from-consumer-group",
            f"group {group!r} has no committed offsets on {kafka.bootstrap_servers} "
            f"(check the name: kafka-consumer-groups.sh --list)",
        )
    # Kafka deletes a group's committed offsets with their topic: those found now were committed
    # in the current incarnation of each topic
    return Source(f"consumer group {group!r}", offsets, dropped_with_topic=True)


def from_table(
    store: Store,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    where: tuple[str, str] | None = None,
) -> Source:
    """The offsets of a legacy table (see :func:`read_table`)."""
    return Source(f"table {table}", read_table(store, table, columns=columns, where=where))


def _ident(value: str, what: str) -> str:
    return validate_identifier(value, what)


def read_table(
    store: Store,
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
    with store.connect() as conn:
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


@dataclass(frozen=True)
class Incarnation:
    """What tells which incarnation (Kafka topic id) of each topic the offsets were taken in: the
    :class:`Source`'s evidence and the operator's word (`topic_ids`, or `current` for every topic)."""

    written_at_ms: int | None = None
    dropped_with_topic: bool = False
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    current: bool = False

    @classmethod
    def of(
        cls, source: Source, *, topic_ids: Mapping[str, str] | None = None, current: bool = False
    ) -> Incarnation:
        """The source's evidence, and the operator's word if any."""
        return cls(source.written_at_ms, source.dropped_with_topic, dict(topic_ids or {}), current)

    def operator(self, topic: str, topic_id: str) -> str | None:
        """The operator's word on `topic` (whose current id is `topic_id`) as the plan and the
        audit say it, or None."""
        if topic in self.topic_ids:
            return f"topic id {topic_id} named with {TOPIC_ID}"
        if self.current:
            return f"topic id {topic_id}, the current one, on the operator's word ({CURRENT_INCARNATION})"
        return None


def _when(ms: int | None) -> str:
    if ms is None:
        return "an unknown time (no record read in time)"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _written_late(
    kafka: KafkaSettings,
    offsets: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, tuple[int, int]],
    infos: Mapping[str, TopicInfo],
    written_at_ms: int,
    *,
    source: str,
    timeout_s: float,
) -> tuple[set[str], dict[str, str]]:
    """The topics whose imported offsets pass over records (past the log start), and per topic why
    its offsets were not taken in this log: a record before one written after the source's time
    (Kafka's offset for ``written_at_ms + 1``, the end if none, is below the offset)."""
    # the records an offset passes over end at the log's end (one forced past it passes over all)
    passing = {tp: upto for tp, off in offsets.items() if (upto := min(off, marks[tp][1])) > marks[tp][0]}
    if not passing:
        return set(), {}
    newer = metadata.offsets_for_time(kafka, passing, written_at_ms + 1, timeout_s=timeout_s)
    late = sorted(tp for tp, upto in passing.items() if newer[tp] < upto)
    # only to say what was found: the time of each late partition's first record
    firsts = first_timestamps(kafka, {tp: marks[tp][0] for tp in late}, timeout_s=timeout_s) if late else {}
    out: dict[str, str] = {}
    for topic, group in itertools.groupby(late, key=lambda tp: tp[0]):
        first_tp, *others = group
        (start, end), off, first = marks[first_tp], offsets[first_tp], firsts.get(first_tp)
        upto = passing[first_tp]
        said = (
            f"{source} was written at {_when(written_at_ms)}, but {topic}[{first_tp[1]}] (topic id "
            f"{infos[topic].topic_id}, log {start}..{end}) has records written after that before the "
            f"offset {off} to import (from offset {newer[first_tp]}; the log's first record was "
            f"written at {_when(first)})"
        )
        if first is not None and first > written_at_ms:
            said += (
                f": {topic} was created after the source was written (deleted and re-created since), "
                f"so the source's offsets are positions in an earlier incarnation, and importing them "
                f"would pass over offsets {start}..{upto - 1} of the current topic, never read"
            )
        else:  # same incarnation is possible, yet unproven: the operator decides
            said += (
                ": the source did not read those records (a producer's or broker's clock ahead of "
                "the one that wrote the source, or records carrying timestamps of their own?)"
            )
        if others:
            said += f" (and {len(others)} more partition(s) of {topic})"
        out[topic] = said
    return {t for t, _ in passing}, out


def incarnation_evidence(
    kafka: KafkaSettings,
    offsets: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, tuple[int, int]],
    infos: Mapping[str, TopicInfo],
    incarnation: Incarnation,
    *,
    source: str,
    timeout_s: float = 10.0,
) -> tuple[dict[str, str], tuple[str, ...]]:
    """Per topic of `offsets`, the evidence that its offsets are positions in the topic's current
    incarnation (its id in `infos`; `marks`: each partition's (log start, end)), and the failed
    time checks the operator's word overrode. Raises ConfigError, naming what to do, when nothing
    says so, when a named topic id is not Kafka's, or when the source's time shows its offsets were
    taken in another incarnation (the rules: this module's docstring)."""
    topics = sorted({t for t, _ in offsets})
    stray = sorted(set(incarnation.topic_ids) - set(topics))
    if stray:
        raise ConfigError(
            TOPIC_ID,
            f"names {', '.join(stray)}, which this import does not take (it imports {', '.join(topics)})",
        )
    for topic in topics:
        named = incarnation.topic_ids.get(topic)
        if named is not None and named != infos[topic].topic_id:
            raise ConfigError(
                TOPIC_ID,
                f"{topic}={named}, but Kafka's {topic} has topic id {infos[topic].topic_id}: the topic "
                f"was deleted and re-created since, so offsets taken in {named} are not positions in "
                f"it. Leave {topic} out of the import and choose where the job starts it (its start "
                f"policy, or offsets reset)",
            )
    passing: set[str] = set()
    late: dict[str, str] = {}
    t = incarnation.written_at_ms
    if t is not None:
        passing, late = _written_late(kafka, offsets, marks, infos, t, source=source, timeout_s=timeout_s)
    evidence: dict[str, str] = {}
    overruled: list[str] = []
    for topic in topics:
        tid = infos[topic].topic_id
        word = incarnation.operator(topic, tid)
        if topic in late:
            if word is None:
                raise ConfigError(
                    "import",
                    f"{late[topic]}. Leave {topic} out of the import and choose where the job starts "
                    f"it (its start policy, or offsets reset); if these offsets are positions in the "
                    f"current {topic} after all, pass {TOPIC_ID} {topic}={tid} or {CURRENT_INCARNATION}",
                )
            overruled.append(late[topic])
            evidence[topic] = f"{word}, over the source's time ({_when(t)}), which it contradicts"
            continue
        if t is not None and topic in passing:
            found = (
                f"no record of topic id {tid} before the imported offsets was written after the "
                f"source's time {_when(t)} (Kafka's offsets for that time)"
            )
        elif t is not None:
            found = f"the imported offsets pass over no record of topic id {tid} (each at its log start)"
        elif incarnation.dropped_with_topic:
            found = f"a consumer group's offsets: Kafka deletes them with their topic (topic id {tid})"
        elif word is not None:
            found = word
        else:
            raise ConfigError(
                TOPIC_ID,
                f"{source} does not say which incarnation of {topic} its offsets were taken in (no "
                f"topic id, no time), and a topic deleted and re-created since would have them "
                f"stored as positions in the new topic, passing over its records unread: pass "
                f"{TOPIC_ID} {topic}=ID with the topic id they were taken in (checked against "
                f"Kafka's, now {tid}), or {CURRENT_INCARNATION} if they were taken in the current topic",
            )
        evidence[topic] = found if word is None or found == word else f"{found}; {word}"
    return evidence, tuple(overruled)
