"""``offsets import``: bring a job's position from another offset store, a plan first, then one
audited transaction (the move-plan shape of :mod:`txn_offsets.admin.moves`).

The offsets come from a source (:mod:`txn_offsets.admin.sources`: a Structured Streaming
checkpoint, a Kafka consumer group or a legacy table). :func:`plan_import` checks them against
Kafka and the store and changes nothing; it imports only the topics the job reads
(:func:`select_topics`: the ``topics`` named, else the job's own, else the source's only topic)
and lists the others as not imported. :func:`apply_import` writes them under the job row's lock,
like a reset: rows the job did not have are inserted and audited ``import``; with ``force``, rows
it had are moved by :func:`txn_offsets.store.offset_rows.reset_offsets` (audited ``reset``, reason
"import ..."); the generation is bumped either way, so a run that planned from the old offsets is
fenced.

No import leaves the log (:mod:`txn_offsets.admin.moves`): an offset of the source outside
[log start, end] is refused, naming the partition, the offset and the log's bounds (past the end it
is not a position in this topic; below the start, records the old consumer never read were
deleted); ``allow_outside_log`` imports it anyway, and its audit reason says so (the job then finds
data loss there: DataLoss, or an audited skip).

No import is stored under the current topic id without evidence that its offsets were taken in
that incarnation of the topic: the plan asks :func:`txn_offsets.admin.sources.incarnation_evidence`,
carries the evidence per topic, and each audit row's reason records it. A topic deleted and
re-created is a new Kafka topic id, its offsets starting again at 0; an old offset stored under the
new id passed over the new topic's records unread (issue 41: a checkpoint's T[0] = 60, T re-created
with 100 records, the job counted 40). The evidence, per topic:

* a checkpoint's batch time ``t`` (Spark fetches the offsets, then stamps the batch): every record
  of the current log before an imported offset must have been written by ``t`` (Kafka's offset
  for ``t + 1 ms`` is at or past it). A topic created after ``t`` has only later records and fails.
  An offset at its log start passes over nothing and needs no time;
* a consumer group: Kafka deletes a group's offsets with their topic;
* otherwise (a legacy table, a checkpoint without times) the operator's word: ``--topic-id T=ID``
  (checked against Kafka's current id) or ``--current-topic-incarnation``. Either also overrides a
  failed time check (a clock ahead of the Spark driver's); the plan notes it.

The time check trusts record timestamps (log append time, or producers' clocks): a topic refilled
after the checkpoint with records keeping old timestamps (a restore, a mirror) looks as old.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.admin.moves import ALLOW_OUTSIDE_LOG, Move, MovePlan, forced_reason, in_log, outside_log
from txn_offsets.admin.sources import Incarnation, incarnation_evidence
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, UnknownJob
from txn_offsets.kafka import metadata
from txn_offsets.ranges import TopicPartition
from txn_offsets.store import offset_rows
from txn_offsets.store.audit import check_offsets
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import already_running, lock_job, validate_job

__all__ = ["ImportPlan", "ImportStep", "apply_import", "plan_import", "select_topics"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportStep(Move):
    """A move, with the partition's log (start, end) in Kafka when the plan was made."""

    log_start: int
    end: int


@dataclass(frozen=True)
class ImportPlan(MovePlan):
    steps: tuple[ImportStep, ...]
    source: str
    topic_ids: Mapping[str, str]
    unlisted: tuple[TopicPartition, ...]  # partitions of the topics the source has no offset for
    not_imported: Mapping[str, int] = field(default_factory=dict)  # source topic -> its partitions
    forced: Mapping[TopicPartition, str] = field(default_factory=dict)  # outside the log, allowed
    # topic -> why its offsets are positions in the topic id stored with them (incarnation_evidence)
    evidence: Mapping[str, str] = field(default_factory=dict)
    overruled: tuple[str, ...] = ()  # a failed time check the operator's word overrode
    # every step's partition already held its offset, stored under the topic id the plan found
    # (the same incarnation): the import would change nothing
    unchanged: bool = False

    @property
    def existing(self) -> list[ImportStep]:
        return [s for s in self.steps if s.old is not None]

    def notes(self) -> list[str]:
        out = [
            f"{said}: imported anyway ({ALLOW_OUTSIDE_LOG}); the job will raise DataLoss there (or "
            f"skip, audited, with on_data_loss='skip')"
            for said in self.forced.values()
        ]
        out.extend(f"{said}; imported on the operator's word" for said in self.overruled)
        if self.unlisted:
            shown = ", ".join(f"{t}[{p}]" for t, p in self.unlisted[:8])
            out.append(f"no offset in the source for {shown}: the job starts those at their log start")
        return out


def _names(topics: Collection[str]) -> str:
    return ", ".join(sorted(topics))


def select_topics(
    source_topics: Collection[str], *, source: str, job: str, named: Collection[str], own: Collection[str]
) -> set[str]:
    """The topics of the source to import: those `named` (``--topic``; each must be in the
    source), else the job's `own` topics (those it has offset rows for; the source must hold one
    of them), else the source's topic if it holds just one. A topic of the source the job does
    not read is never taken without being named: a row that no run moves would show lag forever."""
    held = set(source_topics)
    if named:
        missing = sorted(set(named) - held)
        if missing:
            raise ConfigError(
                "--topic",
                f"{missing[0]!r} is not in {source}: it holds offsets for {_names(held)}",
            )
        return set(named)
    if own:
        mine = held & set(own)
        if not mine:
            raise ConfigError(
                "--topic",
                f"job {job!r} reads {_names(own)} and {source} holds offsets for {_names(held)} only: "
                f"pass --topic to import one of those into this job anyway",
            )
        return mine
    if len(held) > 1:
        raise ConfigError(
            "--topic",
            f"{source} holds offsets for {len(held)} topics ({_names(held)}) and job {job!r} has no "
            f"offsets yet: pass --topic for each topic the job reads (the others are not imported)",
        )
    return held


def plan_import(
    store: Store,
    job: str,
    offsets: Mapping[TopicPartition, int],
    *,
    source: str,
    kafka: KafkaSettings,
    topics: Collection[str] = (),
    timeout_s: float = 10.0,
    allow_outside_log: bool = False,
    incarnation: Incarnation | None = None,
) -> ImportPlan:
    """Check `offsets` against Kafka (topics and partitions exist, every offset inside the log
    unless `allow_outside_log`, and the offsets taken in each topic's current incarnation:
    :func:`incarnation_evidence`, from `incarnation`, :meth:`Incarnation.of` the source; None or
    empty refuses) and against the store; changes nothing. Only the topics :func:`select_topics`
    picks (`topics`, else the job's own) are planned; the source's others are listed in
    ``not_imported``."""
    validate_job(job)
    check_offsets(offsets)  # the store's own validation of topic/partition/offset values
    if not offsets:
        raise ConfigError("import", f"{source} has no offsets")
    with store.connect() as conn:
        try:
            state = lock_job(conn, store.settings, job, for_update=False)
        except UnknownJob:
            state = None
        rows = offset_rows.load_rows(conn, store.settings, job)
    stored = {tp: row.off for tp, row in rows.items()}
    held = collections.Counter(t for t, _ in offsets)
    chosen = select_topics(held, source=source, job=job, named=topics, own={t for t, _ in stored})
    not_imported = {t: n for t, n in sorted(held.items()) if t not in chosen}
    offsets = {tp: off for tp, off in offsets.items() if tp[0] in chosen}
    infos = metadata.describe_topics(kafka, sorted({t for t, _ in offsets}), timeout_s=timeout_s)
    for topic, part in sorted(offsets):
        if part not in infos[topic].partitions:
            raise ConfigError(
                "import",
                f"{source}: {topic} has no partition {part} (it has {list(infos[topic].partitions)})",
            )
    marks = metadata.watermarks(kafka, offsets.keys(), timeout_s=timeout_s)
    forced: dict[TopicPartition, str] = {}
    for (topic, part), off in sorted(offsets.items()):
        if in_log(off, marks[(topic, part)]):
            continue
        said = f"{source}: " + outside_log(topic, part, off, marks[(topic, part)])
        if not allow_outside_log:
            why = (
                "it is not a position in this topic (another cluster, or the topic was re-created)"
                if off > marks[(topic, part)][1]
                else "records the source had not read were deleted by Kafka"
            )
            raise ConfigError(
                ALLOW_OUTSIDE_LOG,
                f"{said}: {why}; pass {ALLOW_OUTSIDE_LOG} to import it anyway (the job then finds "
                f"data loss there: DataLoss, or an audited skip with on_data_loss='skip')",
            )
        forced[(topic, part)] = said
    evidence, overruled = incarnation_evidence(
        kafka, offsets, marks, infos, incarnation or Incarnation(), source=source, timeout_s=timeout_s
    )
    steps = tuple(
        ImportStep(t, p, stored.get((t, p)), off, *marks[(t, p)]) for (t, p), off in sorted(offsets.items())
    )
    unlisted = tuple(sorted((t, p) for t in infos for p in infos[t].partitions if (t, p) not in offsets))
    topic_ids = {t: info.topic_id for t, info in infos.items()}
    return ImportPlan(
        job=job,
        generation=None if state is None else state.generation,
        steps=steps,
        live_run=state.run_id if state is not None and state.live else None,
        heartbeat_age_s=0.0 if state is None else state.heartbeat_age_s,
        lease_left_s=state.lease_left_s if state is not None and state.live else None,
        lease_s=state.lease_s if state is not None and state.live else None,
        source=source,
        topic_ids=topic_ids,
        unlisted=unlisted,
        not_imported=not_imported,
        forced=forced,
        evidence=evidence,
        overruled=overruled,
        unchanged=_unchanged(steps, rows, topic_ids),
    )


def _unchanged(
    steps: Collection[ImportStep],
    rows: Mapping[TopicPartition, offset_rows.StoredOffset],
    topic_ids: Mapping[str, str],
) -> bool:
    """Whether every step's partition holds its offset already, under the same topic id: an
    offset stored without an id, or under another incarnation's, is a change (the import records
    the incarnation)."""
    return bool(steps) and all(
        rows.get((s.topic, s.partition)) == offset_rows.StoredOffset(s.new, topic_ids[s.topic]) for s in steps
    )


def _by_reason(plan: ImportPlan, why: str) -> dict[str, list[ImportStep]]:
    """The steps grouped by their audit reason: each says the evidence of its topic's incarnation,
    and a step forced outside the log says so."""
    out: dict[str, list[ImportStep]] = {}
    for s in plan.steps:
        found = plan.evidence.get(s.topic)
        reason = why if found is None else f"{why} [incarnation of {s.topic}: {found}]"
        said = plan.forced.get((s.topic, s.partition))
        out.setdefault(reason if said is None else forced_reason(reason, [said]), []).append(s)
    return out


def apply_import(
    store: Store,
    plan: ImportPlan,
    *,
    reason: str | None = None,
    actor: str | None = None,
    force: bool = False,
) -> int:
    """Write `plan` in one transaction; returns the job's new generation. Refuses (changing
    nothing) when the job has offsets for the imported partitions or a live run, unless `force`,
    and when the offsets moved since the plan was made. A plan that changes nothing
    (``plan.unchanged``, checked again under the lock) writes nothing and returns the generation
    as it is: no --force, no audit row, no fencing."""
    who = actor or offset_rows.default_actor()
    why = f"import from {plan.source}" + (f": {reason.strip()}" if reason and reason.strip() else "")
    t = store.tables
    with store.begin() as conn:
        conn.execute(pg_insert(t.jobs).values(job=plan.job).on_conflict_do_nothing())
        state = lock_job(conn, store.settings, plan.job)  # FOR UPDATE: claims in flight finish first
        rows = offset_rows.load_rows(conn, store.settings, plan.job)
        current = {tp: row.off for tp, row in rows.items()}
        stale = plan.moved_since(current)
        if stale is not None:
            raise ConfigError(
                "import",
                f"{stale.topic}[{stale.partition}] moved since the plan was made; run the import again",
            )
        if _unchanged(plan.steps, rows, plan.topic_ids):
            return state.generation
        if state.live and not force:
            raise already_running(state)
        if current and not force:
            first = next(iter(sorted(current.items())))
            raise ConfigError(
                "--force",
                f"job {plan.job!r} already has offsets for {len(current)} partition(s) "
                f"(e.g. {first[0][0]}[{first[0][1]}] at {first[1]}); importing would replace them: "
                f"pass --force, or import into a new job name",
            )
        for why_step, group in _by_reason(plan, why).items():
            moved = {(s.topic, s.partition): s.new for s in group if s.old is not None}
            fresh = {(s.topic, s.partition): s.new for s in group if s.old is None}
            if fresh:
                offset_rows.seed_offsets(
                    conn,
                    store.settings,
                    plan.job,
                    fresh,
                    action="import",
                    reason=why_step,
                    actor=who,
                    topic_ids=plan.topic_ids,
                )
            if moved:  # audits 'reset', bumps the generation and drops the lease
                offset_rows.reset_offsets(
                    conn,
                    store.settings,
                    plan.job,
                    moved,
                    reason=why_step,
                    actor=who,
                    topic_ids=plan.topic_ids,
                )
        if not plan.existing:  # reset_offsets bumped it otherwise
            conn.execute(
                sa.update(t.jobs)
                .where(t.jobs.c.job == plan.job)
                .values(generation=t.jobs.c.generation + 1, run_id=None, lease_until=None)
            )
        generation = lock_job(conn, store.settings, plan.job).generation
    logger.info(
        "job %r: imported %r partition(s) from %s, generation now %r",
        plan.job,
        len(plan.steps),
        plan.source,
        generation,
    )
    return generation
