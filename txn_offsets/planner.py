"""Driver side, step 1 of the protocol: turn stored offsets and Kafka's end offsets into a batch.

Each plan discovers the topics' partitions again, so partitions added while the job runs are
picked up (a job catching up plans from its last batch's plan in between, for up to
``runner.REPLAN_EVERY_S``, 5 s: :func:`plan_next`). A partition without an offset row gets one
(audited): at the start policy when the job planned for the first time, at the log start for a
topic or partition that appears later. End offsets come from Kafka at the readers' isolation level
(the LSO under read_committed).

A stored offset is a claim about one incarnation of a topic (its Kafka topic id is stored with
it). Data loss is any stored offset that no longer points into the topic's log: below the log
start (retention), above the end (truncation), or of an older topic id (deleted and re-created).
It raises ``DataLoss`` by default, or is an audited skip with ``on_data_loss="skip"``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.data_loss import ON_DATA_LOSS, OnDataLoss, check_on_data_loss
from txn_offsets.errors import ConfigError
from txn_offsets.kafka import metadata
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan_moves import settle_offsets, unmoved
from txn_offsets.ranges import BatchShare, OffsetRange, TopicPartition, check_share, plan_ranges
from txn_offsets.store import lineage, offset_rows, pooler
from txn_offsets.store.database import translate_errors
from txn_offsets.store.lease import renew_and_load
from txn_offsets.store.offset_rows import StoredOffset
from txn_offsets.store.runs import Run, renew_lease
from txn_offsets.store.schema import tables_for

__all__ = [
    "ON_DATA_LOSS",
    "Limits",
    "OnDataLoss",
    "Plan",
    "TopicSelection",
    "check_on_data_loss",
    "plan_batch",
    "plan_from",
    "plan_next",
    "preflight",
]

logger = logging.getLogger(__name__)


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

    @classmethod
    def of(cls, topics: Sequence[str], pattern: str | None) -> TopicSelection:
        """From the keywords of ``run_job`` (`topics`, `topic_pattern`)."""
        if isinstance(topics, str):
            raise ConfigError("topics", f"give a list of topic names, not the string {topics!r}")
        return cls(tuple(topics), pattern)

    def resolve(self, kafka: KafkaSettings, timeout_s: float) -> list[str]:
        if self.pattern is not None:
            return metadata.topics_matching(kafka, self.pattern, timeout_s=timeout_s)
        return list(self.topics)


@dataclass(frozen=True)
class Limits:
    """Caps of one batch (None: no cap). `batch_share`: how `max_records_per_batch` is shared over
    the partitions, "even" (water-filling: small backlogs first, the rest split evenly) or
    "backlog" (in proportion to each partition's backlog, like Spark's ``maxOffsetsPerTrigger``)."""

    max_records_per_partition: int | None = None
    max_records_per_batch: int | None = None
    batch_share: BatchShare = "even"

    def __post_init__(self) -> None:
        for name in ("max_records_per_partition", "max_records_per_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(name, f"must be a positive whole number or None, got {value!r}")
        check_share(self.batch_share)
        if self.batch_share != "even" and self.max_records_per_batch is None:
            raise ConfigError(
                "batch_share",
                f"{self.batch_share!r} shares max_records_per_batch, which is not set: set it, or leave "
                f"batch_share at 'even'",
            )


@dataclass(frozen=True)
class Plan:
    """The ranges of one batch plus what the planner saw (for the log line and lag)."""

    ranges: tuple[OffsetRange, ...]
    ends: Mapping[TopicPartition, int]
    stored: Mapping[TopicPartition, int]
    # what the next plan from this one needs (plan_next); the ranges carry their own
    topic_ids: Mapping[str, str] = field(default_factory=dict, compare=False)

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
    metadata.describe_topics(kafka, selection.resolve(kafka, timeout_s), timeout_s=timeout_s)


def plan_batch(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    job: str,
    selection: TopicSelection,
    start: StartPolicy | None,
    limits: Limits,
    on_data_loss: OnDataLoss = "fail",
    timeout_s: float = 15.0,
    generation: int | None = None,
    run: Run | None = None,
) -> Plan:
    """Plan the next batch of `job` (seeding and data-loss skips are committed here, audited).

    With `generation`, every offset this plan moves (seeds, skips) is moved under the job row's
    lock by that generation or not at all (Fenced). With `run` (the generation is then the run's),
    the plan's transaction also renews the run's lease: a run's heartbeat before each batch
    without a transaction of its own.
    """
    if run is not None:
        if run.job != job or generation not in {None, run.generation}:
            raise ConfigError("run", f"{run!r} is not a run of job {job!r} at generation {generation!r}")
        generation = run.generation
    check_on_data_loss(on_data_loss)
    topics = selection.resolve(kafka, timeout_s)
    # topic ids, partitions and their (log start, end): one wait on Kafka, a request per 512. A
    # running job's one statement (lease renewed, rows read) runs meanwhile: one wait, not two
    quick_run = run if run is not None and not lineage.prune_is_due(db, job) else None
    asked = (
        _ASKING.submit(
            metadata.topics_and_watermarks, kafka, topics, timeout_s=timeout_s, reuse_within_s=DESCRIBED_FOR_S
        )
        if quick_run is not None
        else None
    )
    found = _renewed_rows(engine, db, quick_run) if quick_run is not None else None
    infos, marks = (
        asked.result()
        if asked is not None
        else metadata.topics_and_watermarks(kafka, topics, timeout_s=timeout_s)
    )
    topic_ids = {topic: info.topic_id for topic, info in infos.items()}
    partitions: list[TopicPartition] = [(t, p) for t in topics for p in infos[t].partitions]
    if found is not None:
        planned_before, rows = found
        quick = unmoved(rows, partitions, marks, topic_ids, first_plan=not planned_before)
        if quick is not None:  # the lease renewed, nothing to move: one statement was the plan's all
            return plan_from(quick, marks, partitions, limits, topic_ids)
    if not all(info.described for info in infos.values()):  # moves are decided on Kafka's word of now
        infos, marks = metadata.topics_and_watermarks(kafka, topics, timeout_s=timeout_s)
        topic_ids = {topic: info.topic_id for topic, info in infos.items()}
        partitions = [(t, p) for t in topics for p in infos[t].partitions]
    # a missing offsets table or an unreachable server is one of our errors (SchemaMissing,
    # ServiceUnavailable: retried by the runner), never a raw driver error
    with translate_errors(db), engine.begin() as conn:
        if run is not None:
            state = renew_lease(conn, db, run)
            lineage.prune_due(conn, db, job)  # bounded, at most every few minutes (retention)
        else:
            state = offset_rows.check_generation(conn, db, job, generation)
        stored, settled = settle_offsets(
            conn,
            db,
            kafka,
            job=job,
            partitions=partitions,
            marks=marks,
            topic_ids=topic_ids,
            first_plan=state.first_plan_at is None,
            start=start,
            on_data_loss=on_data_loss,
            timeout_s=timeout_s,
            generation=generation,
        )
    return plan_from(stored, settled, partitions, limits, topic_ids)


# where a running job's plan asks Kafka while its statement runs (threads made as plans need them)
_ASKING = ThreadPoolExecutor(max_workers=16, thread_name_prefix="txn-offsets-plan")
# a running job's plan over more than LIST_OFFSETS_CHUNK partitions reuses its topics' description
# for this long (kafka.described): partitions added to them are planned within it
DESCRIBED_FOR_S = 5.0


def _renewed_rows(
    engine: sa.Engine, db: DatabaseSettings, run: Run
) -> tuple[bool, dict[TopicPartition, StoredOffset]] | None:
    """A running job's plan without a transaction of its own: one statement renews the lease and
    reads the rows (autocommit; behind a transaction pooler in a transaction, which carries the
    timeouts). If nothing is to be moved (:func:`unmoved`) they are the plan's stored offsets;
    otherwise (or None: fenced) the plan's transaction settles, or raises, as always."""
    with translate_errors(db), engine.connect() as opened:
        conn = opened if pooler.pooled(opened) else opened.execution_options(isolation_level="AUTOCOMMIT")
        with conn.begin():
            return renew_and_load(conn, db, run)


def plan_from(
    stored: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, tuple[int, int]],
    partitions: Sequence[TopicPartition],
    limits: Limits,
    topic_ids: Mapping[str, str],
) -> Plan:
    """The batch's ranges from the stored offsets to Kafka's ends (`marks`: log start, end), within
    `limits` (pure: what plan_batch and the joint plans of many jobs share)."""
    ends = {tp: marks[tp][1] for tp in partitions}
    ranges = plan_ranges(
        stored,
        ends,
        max_per_partition=limits.max_records_per_partition,
        max_total=limits.max_records_per_batch,
        share=limits.batch_share,
        topic_ids=topic_ids,
    )
    return Plan(ranges=tuple(ranges), ends=ends, stored=stored, topic_ids=topic_ids)


def plan_next(committed: Plan, limits: Limits) -> Plan | None:
    """The batch after `committed` (every range of it committed) from what its plan saw, with no
    round trip, or None when only a fresh plan will do: unless the ends it saw still fill a whole
    ``max_records_per_batch``, a fresh plan may find more to read (pure).

    The runner uses it while a job catches up. It needs no proof from the store or Kafka: its
    ranges start where the committed ranges ended (the offsets the claims stored), so the claims'
    guard (``off = start`` and the generation, the topic id after the read) holds it to the same
    rules as a fresh plan - a newer run fences it, a re-created topic fails its task, a start
    deleted by retention fails its read; each of those plans afresh, as any failed batch does."""
    cap = limits.max_records_per_batch
    if cap is None:
        return None
    stored = {**committed.stored, **{r.key: r.until for r in committed.ranges}}
    ranges = plan_ranges(
        stored,
        committed.ends,
        max_per_partition=limits.max_records_per_partition,
        max_total=cap,
        share=limits.batch_share,
        topic_ids=committed.topic_ids,
    )
    if sum(r.span for r in ranges) < cap:
        return None
    return Plan(ranges=tuple(ranges), ends=committed.ends, stored=stored, topic_ids=committed.topic_ids)
