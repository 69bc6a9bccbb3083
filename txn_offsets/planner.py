"""Driver side, step 1 of the protocol: turn stored offsets and Kafka's end offsets into a batch.

Each plan discovers the topics' partitions again, so partitions added while the job runs are
picked up. A partition without an offset row gets one (audited): at the start policy when the job
has never seen the topic, at the log start when the partition is new to a known topic. End offsets
come from Kafka at the readers' isolation level (the LSO under read_committed). A stored offset
below the log start means records were deleted before they were processed: ``DataLoss`` by
default, or an audited skip to the log start with ``on_data_loss="skip"``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, DataLoss
from txn_offsets.kafka import metadata
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.ranges import OffsetRange, TopicPartition, plan_ranges
from txn_offsets.store import offset_rows
from txn_offsets.store.database import translate_errors
from txn_offsets.store.schema import tables_for

__all__ = ["Limits", "Plan", "TopicSelection", "plan_batch", "preflight"]

logger = logging.getLogger(__name__)

ON_DATA_LOSS = ("fail", "skip")


@dataclass(frozen=True)
class TopicSelection:
    """The topics a job reads: an explicit list, or a regex matched against the cluster's topics."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        if bool(self.topics) == bool(self.pattern):
            raise ConfigError("topics", "give either a list of topics or a topic_pattern (exactly one)")
        for topic in self.topics:
            if not isinstance(topic, str) or not topic.strip():
                raise ConfigError("topics", f"{topic!r} is not a topic name")

    def resolve(self, kafka: KafkaSettings, timeout_s: float) -> list[str]:
        if self.pattern is not None:
            return metadata.topics_matching(kafka, self.pattern, timeout_s=timeout_s)
        return list(self.topics)


@dataclass(frozen=True)
class Limits:
    """Caps of one batch (None: no cap)."""

    max_records_per_partition: int | None = None
    max_records_per_batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_records_per_partition", "max_records_per_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(name, f"must be a positive whole number or None, got {value!r}")


@dataclass(frozen=True)
class Plan:
    """The ranges of one batch plus what the planner saw (for the log line and lag)."""

    ranges: tuple[OffsetRange, ...]
    ends: Mapping[TopicPartition, int]
    stored: Mapping[TopicPartition, int]

    @property
    def lag(self) -> int:
        """Offsets between the stored positions and the end offsets (an upper bound on records)."""
        return sum(max(0, self.ends[k] - v) for k, v in self.stored.items() if k in self.ends)

    @property
    def lag_after(self) -> int:
        """The lag left once this batch commits."""
        return self.lag - sum(r.span for r in self.ranges)


def preflight(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    job: str,
    selection: TopicSelection,
    timeout_s: float = 15.0,
) -> None:
    """Fail before a run touches anything if the offsets tables are missing or unreachable, or a
    named topic does not exist (so a misconfigured run does not even bump the job's generation)."""
    with translate_errors(db), engine.connect() as conn:
        offset_rows.load_offsets(conn, db, job)
        schema = tables_for(db.schema)
        for table in (schema.jobs, schema.audit, schema.dead_letters):
            conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).all()
    for topic in selection.resolve(kafka, timeout_s):
        metadata.partitions_for(kafka, topic, timeout_s=timeout_s)


def plan_batch(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    job: str,
    selection: TopicSelection,
    start: StartPolicy | None,
    limits: Limits,
    on_data_loss: str = "fail",
    timeout_s: float = 15.0,
    generation: int | None = None,
) -> Plan:
    """Plan the next batch of `job` (seeding and data-loss skips are committed here, audited)."""
    if on_data_loss not in ON_DATA_LOSS:
        raise ConfigError("on_data_loss", f"{on_data_loss!r}: use 'fail' (default) or 'skip'")
    topics = selection.resolve(kafka, timeout_s)
    partitions: list[TopicPartition] = [
        (topic, part)
        for topic in topics
        for part in metadata.partitions_for(kafka, topic, timeout_s=timeout_s)
    ]
    marks = metadata.watermarks(kafka, partitions, timeout_s=timeout_s)
    # a missing offsets table or an unreachable server is one of our errors (SchemaMissing,
    # ServiceUnavailable: retried by the runner), never a raw driver error
    with translate_errors(db), engine.begin() as conn:
        stored = offset_rows.load_offsets(conn, db, job)
        missing = [tp for tp in partitions if tp not in stored]
        if missing:
            stored.update(
                _seed(
                    conn,
                    db=db,
                    kafka=kafka,
                    job=job,
                    stored=stored,
                    missing=missing,
                    start=start,
                    marks=marks,
                    timeout_s=timeout_s,
                )
            )
        for tp in partitions:
            low = marks[tp][0]
            if stored[tp] < low:
                if on_data_loss == "fail":
                    raise DataLoss(job, tp[0], tp[1], stored[tp], low)
                offset_rows.skip_lost(
                    conn,
                    db,
                    job,
                    tp[0],
                    tp[1],
                    stored[tp],
                    low,
                    reason=f"records [{stored[tp]}, {low}) deleted from Kafka before processing",
                    generation=generation,  # a fenced run must not move offsets
                )
                logger.warning(
                    "job %r %s[%d]: skipped lost offsets [%d, %d)", job, tp[0], tp[1], stored[tp], low
                )
                stored[tp] = low
    wanted = {tp: stored[tp] for tp in partitions}
    ends = {tp: marks[tp][1] for tp in partitions}
    ranges = plan_ranges(
        wanted,
        ends,
        max_per_partition=limits.max_records_per_partition,
        max_total=limits.max_records_per_batch,
    )
    return Plan(ranges=tuple(ranges), ends=ends, stored=wanted)


def _seed(
    conn: sa.Connection,
    *,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    job: str,
    stored: Mapping[TopicPartition, int],
    missing: Sequence[TopicPartition],
    start: StartPolicy | None,
    marks: Mapping[TopicPartition, tuple[int, int]],
    timeout_s: float,
) -> dict[TopicPartition, int]:
    known_topics = {topic for topic, _ in stored}
    new_topic = [tp for tp in missing if tp[0] not in known_topics]
    added = [tp for tp in missing if tp[0] in known_topics]
    if new_topic:
        if start is None:
            names = sorted({t for t, _ in new_topic})
            raise ConfigError(
                "start",
                f"job {job!r} has no stored offsets for {', '.join(names)}: choose where a first run starts "
                f"with start=StartPolicy.earliest() | .latest() | .at_timestamp(ms) | .explicit({{...}})",
            )
        first = start.resolve(kafka, new_topic, marks, timeout_s=timeout_s)
        inserted = offset_rows.seed_offsets(
            conn,
            db,
            job,
            first,
            action="seed",
            reason=f"first run, start policy {start.kind}",
            actor="planner",
        )
        if inserted:
            logger.info("job %r: seeded %d partition(s) (%s)", job, len(inserted), start.kind)
    if added:
        # a partition added to a topic the job already reads starts at its beginning: every record
        # of it is new to the job
        inserted = offset_rows.seed_offsets(
            conn,
            db,
            job,
            {tp: marks[tp][0] for tp in added},
            action="new_partition",
            reason="partition added to a topic the job reads; starts at the log start",
            actor="planner",
        )
        if inserted:
            logger.info("job %r: new partition(s) %s start at the log start", job, sorted(inserted))
    # another run may have seeded some partitions concurrently: read back what is stored now
    current = offset_rows.load_offsets(conn, db, job)
    return {tp: current[tp] for tp in missing}
