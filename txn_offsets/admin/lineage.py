"""Read the lineage: a partition's history (``offsets history --partition``) and which run and
batch committed a given record (``offsets explain``).

A partition's history merges its ``commits`` rows (action ``commit``) with its audited moves
(``offset_audit``: seed, reset, data_loss_skip, import, ...), newest first. ``explain`` answers
from the same two tables and the stored offset; it never asks Kafka. Both read in one short
connection; a job that has no row is :class:`~txn_offsets.errors.UnknownJob`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

import sqlalchemy as sa

from txn_offsets.errors import ConfigError
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, validate_job

__all__ = ["VERDICTS", "Explanation", "HistoryRow", "explain", "partition_history"]

#: What `explain` can say about an offset.
VERDICTS = ("committed", "pending", "skipped", "before_start", "unknown")
PRUNE = "lineage_prune"  # the audit action of `offsets prune`: no offset moved


@dataclass(frozen=True)
class HistoryRow:
    """One move of a partition's offset: a commit (``action == "commit"``, ``actor`` is the run
    id) or an audited move (``actor`` is who made it)."""

    at: datetime
    topic: str
    partition: int
    old: int | None
    new: int
    action: str
    actor: str
    reason: str
    generation: int | None
    run_id: str | None = None
    batch: int | None = None
    first_record_at: datetime | None = None
    last_record_at: datetime | None = None


def _commit_row(r: sa.Row[tuple[object, ...]]) -> HistoryRow:
    m = r._mapping
    return HistoryRow(
        m["committed_at"],
        m["topic"],
        m["part"],
        m["from_off"],
        m["until_off"],
        "commit",
        m["run_id"],
        "",
        m["generation"],
        m["run_id"],
        m["batch"],
        m["first_record_at"],
        m["last_record_at"],
    )


def _audit_row(r: sa.Row[tuple[object, ...]]) -> HistoryRow:
    m = r._mapping
    return HistoryRow(
        m["at"],
        m["topic"],
        m["part"],
        m["old_off"],
        m["new_off"],
        m["action"],
        m["actor"],
        m["reason"],
        m["generation"],
    )


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError("limit", f"{limit!r}: give a whole number >= 1")
    return limit


def partition_history(
    store: Store,
    job: str,
    *,
    topic: str | None = None,
    partition: int | None = None,
    limit: int = 50,
) -> list[HistoryRow]:
    """The newest `limit` commits and audited moves of `job` (of `topic` and/or `partition`),
    newest first."""
    _check_limit(limit)
    t = store.tables
    c, a = t.commits, t.audit
    commits = sa.select(c).where(c.c.job == validate_job(job)).order_by(c.c.id.desc()).limit(limit)
    audits = sa.select(a).where(a.c.job == job).order_by(a.c.id.desc()).limit(limit)
    if topic is not None:
        commits, audits = commits.where(c.c.topic == topic), audits.where(a.c.topic == topic)
    if partition is not None:
        commits, audits = commits.where(c.c.part == partition), audits.where(a.c.part == partition)
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        rows = [_commit_row(r) for r in conn.execute(commits)] + [_audit_row(r) for r in conn.execute(audits)]
    # a move's time is its transaction's start; a commit and an audited move of one partition never
    # share a transaction, and the later one waited for the earlier one's row lock
    rows.sort(key=lambda h: h.at, reverse=True)
    return rows[:limit]


@dataclass(frozen=True)
class Explanation:
    """Where record `offset` of `topic[partition]` stands for `job`."""

    job: str
    topic: str
    partition: int
    offset: int
    verdict: str  # one of VERDICTS
    stored: int | None  # the partition's stored offset (None: no row, e.g. dropped by retire)
    commits: list[HistoryRow] = field(default_factory=list)  # the commits holding it, newest first
    # audited moves over it, newest first (verdict unknown: the `offsets prune` that deleted its row)
    moves: list[HistoryRow] = field(default_factory=list)
    oldest_kept: int | None = None  # from_off of the partition's oldest kept commit row

    def message(self) -> str:
        head = f"{self.topic}[{self.partition}] offset {self.offset}: "
        if self.verdict == "committed":
            parts = [_committed(c) for c in self.commits]
            again = (
                f"; the stored offset is {self.stored} now (moved back by a reset): it will be read again"
                if self.stored is not None and self.offset >= self.stored
                else ""
            )
            return head + "; and again ".join(parts) + again
        if self.verdict == "pending":
            return head + f"not committed yet (stored offset {self.stored})"
        if self.verdict in {"skipped", "before_start"}:
            m = self.moves[0]
            what = "skipped" if self.verdict == "skipped" else "before the job's start"
            old = "" if m.old is None else f"{m.old} -> "
            return head + (
                f"{what}: {m.action} {old}{m.new} at {m.at.isoformat(timespec='seconds')} by {m.actor}"
                f" ({m.reason})"
            )
        oldest = "" if self.oldest_kept is None else f"; the oldest kept commit starts at {self.oldest_kept}"
        if self.moves:  # an audited `offsets prune` deleted its commit row
            m = self.moves[0]
            return head + (
                f"outside the known history: its commit row was pruned ({m.action} of [{m.old}, {m.new}) "
                f"at {m.at.isoformat(timespec='seconds')} by {m.actor} ({m.reason})){oldest}"
            )
        return head + (
            "outside the known history: no commit row holds it (pruned by the lineage retention, or "
            f"committed before lineage was recorded){oldest}"
        )


def _committed(c: HistoryRow) -> str:
    batch = "batch unknown" if c.batch is None else f"batch {c.batch}"
    text = (
        f"committed in [{c.old}, {c.new}) by run {c.run_id} (generation {c.generation}), {batch}, "
        f"at {c.at.isoformat(timespec='seconds')}"
    )
    if c.first_record_at is not None and c.last_record_at is not None:
        text += (
            f"; its records are from {c.first_record_at.isoformat(timespec='milliseconds')} "
            f"to {c.last_record_at.isoformat(timespec='milliseconds')}"
        )
    return text


def explain(store: Store, job: str, *, topic: str, partition: int, offset: int) -> Explanation:
    """Which run and batch committed record `offset`, or why none did (see :data:`VERDICTS`)."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError("offset", f"{offset!r}: give a whole number >= 0")
    t = store.tables
    c, a, o = t.commits, t.audit, t.offsets
    here = (c.c.job == validate_job(job), c.c.topic == topic, c.c.part == partition)
    holding = (
        sa.select(c).where(*here, c.c.from_off <= offset, c.c.until_off > offset).order_by(c.c.id.desc())
    )
    audit_here = (a.c.job == job, a.c.topic == topic, a.c.part == partition)
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)
        stored = conn.execute(
            sa.select(o.c.off).where(o.c.job == job, o.c.topic == topic, o.c.part == partition)
        ).scalar_one_or_none()
        commits = [_commit_row(r) for r in conn.execute(holding)]
        audits = [
            _audit_row(r) for r in conn.execute(sa.select(a).where(*audit_here).order_by(a.c.id.desc()))
        ]
        oldest = conn.execute(sa.select(sa.func.min(c.c.from_off)).where(*here)).scalar_one_or_none()
        if stored is None and not commits and not audits:
            known = conn.execute(
                sa.select(o.c.topic, o.c.part).where(o.c.job == job).order_by(o.c.topic, o.c.part).limit(20)
            ).all()
    if stored is None and not commits and not audits:
        shown = ", ".join(f"{r.topic}[{r.part}]" for r in known) or "none"
        raise ConfigError(
            "--topic/--partition",
            f"job {job!r} has no offset for {topic}[{partition}] (its partitions: {shown})",
        )
    explanation = Explanation(job, topic, partition, offset, "unknown", stored, oldest_kept=oldest)
    if commits:
        return replace(explanation, verdict="committed", commits=commits)
    if stored is not None and offset >= stored:
        return replace(explanation, verdict="pending")
    over = [m for m in audits if m.old is not None and m.old <= offset < m.new]
    pruned = [m for m in over if m.action == PRUNE]  # its lineage deleted, the offset never moved
    if len(pruned) < len(over):
        return replace(explanation, verdict="skipped", moves=[m for m in over if m.action != PRUNE])
    seeds = [m for m in audits if m.old is None and offset < m.new]
    if seeds:
        return replace(explanation, verdict="before_start", moves=seeds)
    return replace(explanation, moves=pruned)
