"""``offsets reset``: move a job's offsets to a Kafka position, a time, an offset or by a shift.

Split in two so that a front-end can always show the plan first (:mod:`txn_offsets.admin.moves`):
:func:`plan_reset` reads (offsets, and Kafka where the target needs it) and changes nothing;
:func:`apply_reset` re-checks the plan under the job's lock, refuses while a live run holds the
lease (unless forced), then writes the offsets, the audit rows and the generation bump at once.

No reset leaves the log (:mod:`txn_offsets.admin.moves`): ``--to-offset`` outside [log start, end]
is refused (an explicit offset there is most likely a typo or another cluster's), ``--shift-by``
is clamped to it (as kafka-consumer-groups.sh does; the plan and the audit say so), and the Kafka
targets are inside by construction. ``--allow-outside-log`` moves there anyway; the audit reason
records it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from txn_offsets.admin.moves import (
    ALLOW_OUTSIDE_LOG,
    MAX_OFFSET,
    Move,
    MovePlan,
    forced_reason,
    in_log,
    outside_log,
)
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, TopicMissing
from txn_offsets.kafka import metadata
from txn_offsets.ranges import TopicPartition
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import already_running, lock_job, validate_job

__all__ = ["OffsetOutOfRange", "ResetPlan", "ResetTarget", "TargetKind", "apply_reset", "plan_reset"]

logger = logging.getLogger(__name__)

TargetKind = Literal["earliest", "latest", "datetime", "offset", "shift"]


class OffsetOutOfRange(ConfigError):
    """A shift that would put an offset where none can be, below 0 or past the largest offset
    (:data:`~txn_offsets.admin.moves.MAX_OFFSET`): the asked arithmetic is wrong, whatever the
    log holds. Raised by the plan, so a dry run refuses it too and no such offset is ever shown."""


@dataclass(frozen=True)
class ResetTarget:
    """Where a reset moves the offsets: a Kafka position, a datetime, an offset or a shift."""

    kind: TargetKind
    value: int | None = None  # the offset for 'offset', the delta for 'shift'
    at: datetime | None = None  # for 'datetime' (timezone-aware)
    allow_outside_log: bool = False  # move 'offset'/'shift' outside the log, unchecked if no Kafka

    def __post_init__(self) -> None:
        if self.kind in ("offset", "shift") and self.value is None:
            raise ConfigError(f"--to-{self.kind}", "needs a value")
        if self.kind == "offset" and self.value is not None and self.value < 0:
            raise ConfigError("--to-offset", f"{self.value} is negative; offsets are >= 0")
        if self.kind == "datetime" and (self.at is None or self.at.tzinfo is None):
            raise ConfigError("--to-datetime", "give a timezone, e.g. 2024-05-01T12:00:00Z or ...+02:00")

    @property
    def flag(self) -> str:
        return "--shift-by" if self.kind == "shift" else f"--to-{self.kind}"

    @property
    def needs_kafka(self) -> bool:
        """The target asks Kafka, or is checked against the log (unless allowed outside it)."""
        return self.kind in ("earliest", "latest", "datetime") or not self.allow_outside_log


@dataclass(frozen=True)
class ResetPlan(MovePlan):
    generation: int  # a reset needs the job to exist
    clamped: tuple[str, ...] = ()  # shifts kept inside the log (written to the audit reason)
    forced: tuple[str, ...] = ()  # moves outside the log (allow_outside_log; in the audit reason)
    # the Kafka topic id of each topic the targets were chosen against, stored with the offsets
    # (a topic re-created after the plan is then data loss on the next run, never read from them)
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """What a front-end shows with the plan: clamps and forced moves."""
        return [f"{c} ({ALLOW_OUTSIDE_LOG} to move there anyway)" for c in self.clamped] + [
            f"{f}: moved there anyway ({ALLOW_OUTSIDE_LOG}); the next run finds data loss there"
            for f in self.forced
        ]

    def audit_reason(self, reason: str) -> str:
        """The operator's reason, plus the clamps and forced moves of this plan."""
        why = forced_reason(reason, self.forced)
        return f"{why} [{'; '.join(self.clamped)}]" if self.clamped else why


def _kafka(kafka: KafkaSettings | None, target: ResetTarget) -> KafkaSettings:
    if kafka is None:
        what = (
            "asks Kafka" if target.kind not in ("offset", "shift") else "is checked against the log in Kafka"
        )
        raise ConfigError(
            "--kafka-bootstrap",
            f"{target.flag} {what}; give the bootstrap servers"
            + ("" if what == "asks Kafka" else f" (or {ALLOW_OUTSIDE_LOG} to move without the check)"),
        )
    return kafka


def _value(target: ResetTarget) -> int:
    if target.value is None:  # pragma: no cover - ResetTarget refuses it
        raise ConfigError(target.flag, "needs a value")
    return target.value


def _select(
    stored: dict[TopicPartition, int],
    target: ResetTarget,
    *,
    topic: str | None,
    partitions: Sequence[int],
    kafka: KafkaSettings | None,
    timeout_s: float,
) -> list[TopicPartition]:
    if topic is None:
        if partitions:
            raise ConfigError("--partition", "needs --topic")
        if not stored:
            raise ConfigError("--topic", "the job has no stored offsets yet; name the topic to reset")
        return sorted(stored)
    if target.needs_kafka:
        existing = metadata.partitions_for(_kafka(kafka, target), topic, timeout_s=timeout_s)
    elif target.kind == "offset" and partitions:
        existing = list(partitions)  # an explicit offset may create rows
    else:
        existing = [p for t, p in stored if t == topic]
    unknown = sorted(set(partitions) - set(existing))
    if unknown:
        raise ConfigError("--partition", f"{topic} has no partition(s) {unknown} (it has {sorted(existing)})")
    chosen = sorted(set(partitions) if partitions else set(existing))
    if not chosen:
        raise ConfigError("--topic", f"the job has no stored offsets for topic {topic!r}")
    return [(topic, p) for p in chosen]


def _targets(
    keys: list[TopicPartition],
    stored: dict[TopicPartition, int],
    target: ResetTarget,
    kafka: KafkaSettings | None,
    timeout_s: float,
) -> dict[TopicPartition, int]:
    if target.kind == "offset":
        return dict.fromkeys(keys, _value(target))
    if target.kind == "shift":
        out = {}
        unstored = [f"{t}[{p}]" for t, p in keys if (t, p) not in stored]
        if unstored:
            # a shift moves a stored offset; a partition the job never stored (never planned, or added
            # since its last plan) has none to move from
            raise ConfigError(
                "--shift-by",
                f"the job has no stored offset for {', '.join(unstored[:8])} to shift from: reset those "
                f"partitions to an offset (--to-earliest, --to-latest, --to-offset) or let a run plan them "
                f"first",
            )
        for key in keys:
            new = stored[key] + _value(target)
            if not 0 <= new <= MAX_OFFSET and target.allow_outside_log:  # else clamped to the log
                raise OffsetOutOfRange(
                    "--shift-by",
                    f"{key[0]}[{key[1]}] at {stored[key]} would move to {new}; offsets are 0..{MAX_OFFSET}",
                )
            out[key] = new
        return out
    if target.kind == "datetime" and target.at is not None:
        ms = int(target.at.timestamp() * 1000)
        return metadata.offsets_for_time(_kafka(kafka, target), keys, ms, timeout_s=timeout_s)
    marks = metadata.watermarks(_kafka(kafka, target), keys, timeout_s=timeout_s)
    index = 0 if target.kind == "earliest" else 1
    return {key: marks[key][index] for key in keys}


def _fit(
    asked: dict[TopicPartition, int], target: ResetTarget, kafka: KafkaSettings | None, timeout_s: float
) -> tuple[dict[TopicPartition, int], list[str], list[str]]:
    """The targets kept inside the log: (targets, clamped, forced). An explicit offset outside is
    refused, a shift clamped; with allow_outside_log both move as asked (recorded as forced; not
    checked when no Kafka was given)."""
    if target.kind not in ("offset", "shift"):
        return asked, [], []  # Kafka's own positions: inside the log
    if kafka is None:  # only with allow_outside_log (plan_reset asks for Kafka otherwise)
        return asked, [], ["not checked against the log (no Kafka settings given)"]
    for topic in sorted({t for t, _ in asked}):
        try:
            parts = metadata.partitions_for(kafka, topic, timeout_s=timeout_s)
        except ConfigError as exc:  # a deleted topic has no log to check against
            raise ConfigError(
                "--topic", f"{exc.problem}; {ALLOW_OUTSIDE_LOG} moves its offsets without the check"
            ) from None
        missing = sorted(p for t, p in asked if t == topic and p not in parts)
        if missing:
            raise ConfigError("--partition", f"{topic} has no partition(s) {missing} (it has {parts})")
    marks = metadata.watermarks(kafka, asked, timeout_s=timeout_s)
    out, clamped, forced = dict(asked), [], []
    for key, off in sorted(asked.items()):
        bounds = marks[key]
        if in_log(off, bounds):
            continue
        said = outside_log(key[0], key[1], off, bounds)
        if target.allow_outside_log:
            forced.append(said)
        elif target.kind == "shift":
            out[key] = min(max(off, bounds[0]), bounds[1])
            clamped.append(f"{said}: clamped to {out[key]}")
        else:
            raise ConfigError(
                ALLOW_OUTSIDE_LOG,
                f"{said} (log start, end at {kafka.isolation_level}): a job moved there stops with "
                f"DataLoss on its next run; give an offset inside the log, or pass {ALLOW_OUTSIDE_LOG} "
                f"to move there anyway (audited)",
            )
    return out, clamped, forced


def plan_reset(
    store: Store,
    job: str,
    target: ResetTarget,
    *,
    topic: str | None = None,
    partitions: Sequence[int] = (),
    kafka: KafkaSettings | None = None,
    timeout_s: float = 10.0,
) -> ResetPlan:
    """The old -> new offset of every selected partition. Reads only; changes nothing."""
    validate_job(job)
    if target.needs_kafka:
        _kafka(kafka, target)  # fail before touching anything
    with store.connect() as conn:
        state = lock_job(conn, store.settings, job, for_update=False)
        stored = offset_rows.load_offsets(conn, store.settings, job)
    keys = _select(stored, target, topic=topic, partitions=partitions, kafka=kafka, timeout_s=timeout_s)
    topics = sorted({t for t, _ in keys})
    ids = _incarnations(kafka, topics, target, timeout_s)
    asked = _targets(keys, stored, target, kafka, timeout_s)
    new, clamped, forced = _fit(asked, target, kafka, timeout_s)
    if _incarnations(kafka, topics, target, timeout_s) != ids:
        raise ConfigError(
            "--topic",
            f"{', '.join(topics)} was deleted or re-created while the reset was planned; run it again",
        )
    steps = tuple(Move(t, p, stored.get((t, p)), new[(t, p)]) for t, p in keys)
    live = state.run_id if state.live else None
    return ResetPlan(
        job,
        state.generation,
        steps,
        live,
        state.heartbeat_age_s,
        tuple(clamped),
        tuple(forced),
        ids,
        lease_left_s=state.lease_left_s if live else None,
        lease_s=state.lease_s if live else None,
    )


def _incarnations(
    kafka: KafkaSettings | None, topics: list[str], target: ResetTarget, timeout_s: float
) -> dict[str, str]:
    """The topic id of each of `topics` (asked before and after the targets: the same ids both
    times prove the targets are positions of those incarnations). None without Kafka; a topic
    Kafka does not have is left out only where the target may leave the log (no log to check)."""
    if kafka is None:
        return {}
    try:
        return {
            t: info.topic_id
            for t, info in metadata.describe_topics(kafka, topics, timeout_s=timeout_s).items()
        }
    except TopicMissing:
        if not target.allow_outside_log:
            raise
    out = {}
    for t in topics:  # one at a time: which ones exist
        try:
            out.update(
                {t: i.topic_id for t, i in metadata.describe_topics(kafka, [t], timeout_s=timeout_s).items()}
            )
        except TopicMissing:
            continue
    return out


def apply_reset(
    store: Store,
    plan: ResetPlan,
    *,
    reason: str,
    actor: str | None = None,
    force: bool = False,
) -> int:
    """Carry out `plan`; returns the job's new generation. Refuses while a live run holds the
    lease (unless `force`, which fences it) and if the offsets moved since the plan was made."""
    who = actor or offset_rows.default_actor()
    with store.begin() as conn:
        state = lock_job(conn, store.settings, plan.job)  # FOR UPDATE: claims in flight finish first
        if state.live and not force:
            raise already_running(state)
        current = offset_rows.load_offsets(conn, store.settings, plan.job)
        step = plan.moved_since(current)
        if step is not None:
            now = current.get((step.topic, step.partition))
            raise ConfigError(
                "reset",
                f"{step.topic}[{step.partition}] moved from {step.old} to {now} since the plan was "
                f"made; run the reset again to see a fresh plan",
            )
        targets = {(s.topic, s.partition): s.new for s in plan.steps}
        why = plan.audit_reason(reason)
        offset_rows.reset_offsets(
            conn, store.settings, plan.job, targets, reason=why, actor=who, topic_ids=plan.topic_ids
        )
        generation = lock_job(conn, store.settings, plan.job).generation
    logger.info("job %r: reset %r partitions, generation now %r", plan.job, len(plan.steps), generation)
    return generation
