"""Step 1 of the protocol, one planner for N jobs (one job is N = 1): stored offsets and Kafka's end
offsets turned into each job's next batch.

Each plan discovers the topics' partitions again, so partitions added while the job runs are
picked up (a job catching up plans from its last batch's plan in between, for up to
``runner.REPLAN_EVERY_S``, 5 s: :func:`plan_next`). A partition without an offset row gets one
(audited): at the start policy when the job planned for the first time, at the log start for a
topic or partition that appears later. End offsets come from Kafka at the readers' isolation level
(the LSO under read_committed).

A stored offset is a claim about one incarnation of a topic (its Kafka topic id is stored with
it). Data loss is any stored offset that no longer points into the topic's log: below the log
start (retention), above the end (truncation), or of an older topic id (deleted and re-created).
It raises ``DataLoss`` by default, or is an audited skip with ``on_data_loss="skip"``
(:mod:`txn_offsets.plan.data_loss`; the moves: :mod:`txn_offsets.plan.moves`). A plan's ranges are
handed out once no broker names another id for their topics (:func:`txn_offsets.kafka.recreated.settle`).

The plans of N jobs are made together (:func:`plan_jobs`): ONE Kafka request for all their topics
and ONE statement that renews every running job's lease and reads its rows; the jobs with something
to move (a first plan, a partition to seed, data lost, a lineage prune due) then share ONE
transaction. :func:`plan_batch` is that planner asked for one job `alone`: every move made or
raised. The many jobs of one process (``run_jobs``) ask it together, where a job whose plan must do
more than read after its first plan gets None and plans alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable, TopicChanged, TxnOffsetsError
from txn_offsets.kafka import described, metadata, recreated
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.data_loss import OnDataLoss, check_on_data_loss
from txn_offsets.plan.moves import settle_offsets, unmoved
from txn_offsets.ranges import BatchShare, OffsetRange, TopicPartition, check_share, plan_ranges
from txn_offsets.store import lineage, offset_rows, pooler
from txn_offsets.store.handle import Store
from txn_offsets.store.lease import renew_and_load
from txn_offsets.store.offset_rows import StoredOffset
from txn_offsets.store.runs import Run, fenced, renew_leases

__all__ = [
    "DESCRIBED_FOR_S",
    "Limits",
    "Plan",
    "PlanRequest",
    "TopicSelection",
    "plan_batch",
    "plan_from",
    "plan_jobs",
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
    store: Store,
    kafka: KafkaSettings,
    *,
    job: str,
    selection: TopicSelection,
    timeout_s: float = 15.0,
) -> None:
    """Fail before a run touches anything if the offsets tables are missing or unreachable, or a
    named topic does not exist (so a misconfigured run does not even bump the job's generation)."""
    t = store.tables
    # each table a run writes, read by the run's role in ONE statement (four round trips before, at
    # every run's start): a missing table or a refused read fails it, naming the table
    reads = [sa.select(sa.literal(1)).where(t.offsets.c.job == job)]
    reads += [sa.select(sa.literal(1)).select_from(table) for table in (t.jobs, t.audit, t.dead_letters)]
    with store.connect() as conn:
        conn.execute(sa.select(*(r.limit(1).scalar_subquery() for r in reads))).all()
    metadata.describe_topics(kafka, selection.resolve(kafka, timeout_s), timeout_s=timeout_s)


@dataclass(frozen=True)
class PlanRequest:
    """One job's next plan: its `run` (whose lease the plan renews), or without one the `job` and
    the `generation` (None: any) every move of the plan is made by or not at all (Fenced)."""

    run: Run | None
    selection: TopicSelection
    limits: Limits
    start: StartPolicy | None = None  # where the job's first plan starts
    on_data_loss: OnDataLoss = "fail"
    job: str = ""  # the run's job when a run is given
    generation: int | None = None  # the run's generation when a run is given

    def __post_init__(self) -> None:
        check_on_data_loss(self.on_data_loss)
        if self.run is None:
            if not self.job:
                raise ConfigError("job", "give the job to plan, or its run")
            return
        if self.job not in {"", self.run.job} or self.generation not in {None, self.run.generation}:
            raise ConfigError(
                "run", f"{self.run!r} is not a run of job {self.job!r} at generation {self.generation!r}"
            )
        object.__setattr__(self, "job", self.run.job)
        object.__setattr__(self, "generation", self.run.generation)


def plan_batch(
    store: Store,
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
    """Plan the next batch of `job` (seeding and data-loss skips are committed here, audited): the
    planner of N jobs (:func:`plan_jobs`) asked for one, `alone`.

    With `generation`, every offset this plan moves (seeds, skips) is moved under the job row's
    lock by that generation or not at all (Fenced). With `run` (the generation is then the run's),
    the plan also renews the run's lease: a run's heartbeat before each batch without a
    transaction of its own.
    """
    request = PlanRequest(run, selection, limits, start, on_data_loss, job=job, generation=generation)
    (plan,) = plan_jobs(store, kafka, [request], timeout_s=timeout_s, alone=True)
    if plan is None:  # pragma: no cover - alone, a plan makes its moves or raises
        raise AssertionError("a plan made alone is never None")
    return plan


def plan_jobs(
    store: Store,
    kafka: KafkaSettings,
    requests: Sequence[PlanRequest],
    *,
    timeout_s: float = 15.0,
    alone: bool = False,
) -> list[Plan | None]:
    """The next plans of several runs (of different jobs on one store and Kafka cluster), made
    together (see the module). Many jobs in one process (``run_jobs``) plan this way instead of a
    few Kafka requests and a transaction each.

    Each plan is the one :func:`plan_batch` makes for that run; a run's first plan seeds its
    offsets here (by the request's start policy, in a savepoint of its own). None where plan_batch
    would do more than read after its first plan, or raise: a fenced run, a partition to seed, a
    topic id to adopt, data lost, a first plan without a start policy. The caller then plans that
    job with plan_batch, which does (or raises) what is due. A Kafka or database error here is
    raised for all: the callers then plan one by one, so an error stays with the job it belongs to.

    `alone` (:func:`plan_batch`): every request's plan is made, its moves made or raised, never
    None; a request may then be a job's without a run (its `generation` checked instead)."""
    if not alone and any(r.run is None for r in requests):
        raise ConfigError("requests", "the plans made together are those of runs: give each request its run")
    db = store.settings
    topics_of = [r.selection.resolve(kafka, timeout_s) for r in requests]
    every = sorted({t for topics in topics_of for t in topics})
    # topic ids, partitions and their (log start, end): one wait on Kafka, a request per 512. The
    # running jobs' one statement (leases renewed, rows read) runs meanwhile: one wait, not two
    quick = [r.run for r in requests if r.run is not None and not lineage.prune_is_due(db, r.job)]
    asked = (
        _ASKING.submit(
            metadata.topics_and_watermarks, kafka, every, timeout_s=timeout_s, reuse_within_s=DESCRIBED_FOR_S
        )
        if quick
        else None
    )
    found = _renewed_rows(store, quick) if quick else {}
    infos, marks = (
        asked.result()
        if asked is not None
        else metadata.topics_and_watermarks(kafka, every, timeout_s=timeout_s)
    )
    plans: list[Plan | None] = [None] * len(requests)
    todo: list[int] = []  # the requests the transaction plans
    quick_jobs = {run.job for run in quick}
    for i, (request, topics) in enumerate(zip(requests, topics_of, strict=True)):
        seen = found.get(request.job)
        if request.job in quick_jobs and (seen is None or seen[0]):  # fenced, or planned before
            partitions, topic_ids = _partitions(topics, infos)
            stored = (
                None if seen is None else unmoved(seen[1], partitions, marks, topic_ids, first_plan=False)
            )
            if stored is not None:  # the lease renewed, nothing to move: one statement was the plan's all
                plans[i] = plan_from(stored, marks, partitions, request.limits, topic_ids)
                continue
            if not alone:  # fenced, or a move (seed, adopt, skip) or an error: the job's own plan's
                continue
        todo.append(i)
    if not todo:
        return _settled_ids(kafka, plans, timeout_s)
    moving = sorted({t for i in todo for t in topics_of[i]})
    if not all(infos[t].described for t in moving):  # moves are decided on Kafka's word of now
        fresh, fresh_marks = metadata.topics_and_watermarks(kafka, moving, timeout_s=timeout_s)
        infos, marks = {**infos, **fresh}, {**marks, **fresh_marks}
    # before any move is decided: no broker may answer from a deleted topic's log (a seed at a
    # timestamp asks Kafka by time, which names no topic id: answered after this by the new log)
    _settle(kafka, {t: infos[t].topic_id for t in moving}, timeout_s)
    # a missing offsets table or an unreachable server is one of our errors (SchemaMissing,
    # ServiceUnavailable: retried by the runner), never a raw driver error
    with store.begin() as conn:
        states = renew_leases(conn, db, [run for i in todo if (run := requests[i].run) is not None])
        for i in todo:
            request = requests[i]
            if request.run is None:
                states[request.job] = offset_rows.check_generation(conn, db, request.job, request.generation)
            elif request.job not in states:
                if alone:
                    fenced(conn, db, request.run)
            else:
                lineage.prune_due(conn, db, request.job)  # bounded, at most every few minutes (retention)
        rows = offset_rows.load_rows_of(conn, db, [job for i in todo if (job := requests[i].job) in states])
        for i in todo:
            request = requests[i]
            state = states.get(request.job)
            if state is not None:
                plans[i] = _settled(
                    conn, db, kafka, request, topics_of[i], infos, marks, rows[request.job],
                    first_plan=state.first_plan_at is None, timeout_s=timeout_s, alone=alone,
                )  # fmt: skip
    return _settled_ids(kafka, plans, timeout_s)


def _settled_ids(kafka: KafkaSettings, plans: list[Plan | None], timeout_s: float) -> list[Plan | None]:
    """`plans`, once no broker names another id for a topic they read (a broker behind the
    cluster's metadata would serve the deleted topic's records at their offsets, and could catch up
    before the commit's proof: :func:`txn_offsets.kafka.recreated.settle`)."""
    ids = {r.topic: r.topic_id for plan in plans if plan for r in plan.ranges if r.topic_id is not None}
    if ids:
        _settle(kafka, ids, timeout_s)
    return plans


def _settle(kafka: KafkaSettings, topic_ids: Mapping[str, str], timeout_s: float) -> None:
    """:func:`txn_offsets.kafka.recreated.settle`; a topic re-created since it was described is the
    planner's ServiceUnavailable (what every caller of a plan handles: the runner retries, the
    stream source keeps its query), its description forgotten: the next plan describes it again."""
    try:
        recreated.settle(kafka, topic_ids, timeout_s=timeout_s)
    except TopicChanged as exc:
        described.forget_descriptions([exc.topic])
        raise ServiceUnavailable(
            "Kafka",
            kafka.bootstrap_servers,
            f"{exc.topic!r} was re-created since the plan described it (planned as {exc.planned_id}, "
            f"a broker names {exc.current_id}); the next plan describes it again",
        ) from None


def _settled(  # noqa: PLR0917 - the planner's own values, passed on
    conn: sa.Connection,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    request: PlanRequest,
    topics: Sequence[str],
    infos: Mapping[str, metadata.TopicInfo],
    marks: Mapping[TopicPartition, tuple[int, int]],
    rows: Mapping[TopicPartition, StoredOffset],
    *,
    first_plan: bool,
    timeout_s: float,
    alone: bool,
) -> Plan | None:
    """One job's plan in the planner's transaction, its offsets moved first (seeded, adopted,
    skipped: :func:`~txn_offsets.plan.moves.settle_offsets`). Unless `alone`, only a first plan
    moves, in a savepoint of its own, and None where that raises (no start policy, data lost): the
    savepoint is rolled back and the job's own plan_batch raises it; a later plan with anything
    to move is None."""
    partitions, topic_ids = _partitions(topics, infos)
    if not alone and not first_plan:
        stored = unmoved(rows, partitions, marks, topic_ids, first_plan=False)
        return None if stored is None else plan_from(stored, marks, partitions, request.limits, topic_ids)
    try:
        with contextlib.nullcontext() if alone else conn.begin_nested():
            stored, settled = settle_offsets(
                conn,
                db,
                kafka,
                job=request.job,
                rows=rows,
                partitions=partitions,
                marks=marks,
                topic_ids=topic_ids,
                first_plan=first_plan,
                start=request.start,
                on_data_loss=request.on_data_loss,
                timeout_s=timeout_s,
                generation=request.generation,  # a fenced run must not move offsets
            )
    except TxnOffsetsError as exc:
        if alone:
            raise
        logger.info(
            "job %r: its first plan with others raised %s; it plans alone", request.job, type(exc).__name__
        )
        return None
    return plan_from(stored, settled, partitions, request.limits, topic_ids)


def _partitions(
    topics: Sequence[str], infos: Mapping[str, metadata.TopicInfo]
) -> tuple[list[TopicPartition], dict[str, str]]:
    """The partitions of `topics` and their topic ids, as Kafka described them."""
    return [(t, p) for t in topics for p in infos[t].partitions], {t: infos[t].topic_id for t in topics}


# where a running job's plan asks Kafka while its statement runs (threads made as plans need them)
_ASKING = ThreadPoolExecutor(max_workers=16, thread_name_prefix="txn-offsets-plan")
# a running job's plan over more than LIST_OFFSETS_CHUNK partitions reuses its topics' description
# for this long (kafka.described): partitions added to them are planned within it
DESCRIBED_FOR_S = 5.0


def _renewed_rows(
    store: Store, runs: Sequence[Run]
) -> dict[str, tuple[bool, dict[TopicPartition, StoredOffset]]]:
    """Running jobs' plans without a transaction of their own: one statement renews the leases and
    reads the rows (autocommit; behind a transaction pooler in a transaction, which carries the
    timeouts), by job. Where nothing is to be moved (:func:`unmoved`) they are the plan's stored
    offsets; otherwise (or a job missing: fenced) the planner's transaction settles, or raises, as
    always."""
    with store.connect() as opened:
        conn = opened if pooler.pooled(opened) else opened.execution_options(isolation_level="AUTOCOMMIT")
        with conn.begin():
            return renew_and_load(conn, store.settings, runs)


def plan_from(
    stored: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, tuple[int, int]],
    partitions: Sequence[TopicPartition],
    limits: Limits,
    topic_ids: Mapping[str, str],
) -> Plan:
    """The batch's ranges from the stored offsets to Kafka's ends (`marks`: log start, end), within
    `limits` (pure)."""
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
