"""Offset rows: load, seed, re-read, audited admin moves (never the guarded claim: that is
:mod:`txn_offsets.commit`'s alone).

Every function runs SQL on a Connection it is given and never commits or rolls back: the caller
(the commit shell, :mod:`txn_offsets.commit.shell`, or an admin command) owns the transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError, Fenced, OffsetConflict
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.audit import OffsetChange, check_audit, check_offsets, default_actor, write_audit
from txn_offsets.store.runs import JobState, lock_job
from txn_offsets.store.schema import tables_for

__all__ = [
    "OffsetChange",
    "StoredOffset",
    "adopt_topic_ids",
    "check_generation",
    "default_actor",
    "load_offsets",
    "load_rows",
    "load_rows_of",
    "mark_first_plan",
    "reread",
    "reread_rows",
    "reset_offsets",
    "seed_offsets",
    "skip_lost",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredOffset:
    """A stored offset and the Kafka topic id it belongs to (None: stored before ids were kept)."""

    off: int
    topic_id: str | None


def load_offsets(conn: sa.Connection, db: DatabaseSettings, job: str) -> dict[TopicPartition, int]:
    """The stored offset of every partition of `job` (empty for a job without rows)."""
    offsets = tables_for(db.schema).offsets
    rows = conn.execute(
        sa.select(offsets.c.topic, offsets.c.part, offsets.c.off)
        .where(offsets.c.job == job)
        .order_by(offsets.c.topic, offsets.c.part)
    )
    return {(r.topic, r.part): r.off for r in rows}


def load_rows(conn: sa.Connection, db: DatabaseSettings, job: str) -> dict[TopicPartition, StoredOffset]:
    """Every offset row of `job` with its topic id."""
    return load_rows_of(conn, db, [job])[job]


def load_rows_of(
    conn: sa.Connection, db: DatabaseSettings, jobs: Sequence[str]
) -> dict[str, dict[TopicPartition, StoredOffset]]:
    """:func:`load_rows` of several jobs in one statement, by job (a job without rows: {})."""
    o = tables_for(db.schema).offsets
    out: dict[str, dict[TopicPartition, StoredOffset]] = {job: {} for job in jobs}
    if not jobs:
        return out
    rows = conn.execute(
        sa.select(o.c.job, o.c.topic, o.c.part, o.c.off, o.c.topic_id)
        .where(o.c.job == sa.func.any(sa.bindparam("jobs", list(out), type_=ARRAY(sa.Text))))
        .order_by(o.c.job, o.c.topic, o.c.part)
    )
    for r in rows:
        out[r.job][(r.topic, r.part)] = StoredOffset(r.off, r.topic_id)
    return out


def check_generation(conn: sa.Connection, db: DatabaseSettings, job: str, generation: int | None) -> JobState:
    """Lock the job row FOR KEY SHARE (a new run's bump waits for this transaction) and raise
    Fenced if `generation` is not the current one: every offset move after this call in the same
    transaction is made by the current run or not at all."""
    state = lock_job(conn, db, job, for_update=False, key_share=True)
    if generation is not None and state.generation != generation:
        raise Fenced(job, generation, state.generation)
    return state


def mark_first_plan(conn: sa.Connection, db: DatabaseSettings, job: str) -> None:
    """Record that `job` has planned (the start policy is for the topics of its first plan only)."""
    jobs = tables_for(db.schema).jobs
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.job == job, jobs.c.first_plan_at.is_(None))
        .values(first_plan_at=sa.func.now())
    )


def adopt_topic_ids(
    conn: sa.Connection, db: DatabaseSettings, job: str, topic_ids: Mapping[str, str]
) -> None:
    """Remember the topic id of rows stored before ids were kept (the offset itself does not move)."""
    o = tables_for(db.schema).offsets
    for topic, topic_id in sorted(topic_ids.items()):
        conn.execute(
            sa.update(o)
            .where(o.c.job == job, o.c.topic == topic, o.c.topic_id.is_(None))
            .values(topic_id=topic_id)
        )


def seed_offsets(
    conn: sa.Connection,
    db: DatabaseSettings,
    job: str,
    offsets: Mapping[TopicPartition, int],
    *,
    action: str = "seed",
    reason: str,
    actor: str,
    topic_ids: Mapping[str, str] | None = None,
    generation: int | None = None,
) -> dict[TopicPartition, int]:
    """Create rows for partitions that have none; returns what was inserted (existing rows win).

    ``topic_ids`` records which incarnation of each topic the offsets belong to; with `generation`
    a fenced run raises Fenced instead of seeding.
    """
    check_offsets(offsets)
    check_audit(action, reason, actor)
    if not offsets:
        return {}
    t = tables_for(db.schema)
    state = check_generation(conn, db, job, generation)
    ids = topic_ids or {}
    keys = sorted(offsets)
    # one statement over bound arrays, whatever the partition count (a multi-row VALUES of 4,096
    # rows is compiled anew every time: ~0.5 s of Python)
    arrays = (
        ([tp for tp, _ in keys], sa.Text),
        ([p for _, p in keys], sa.Integer),
        ([offsets[k] for k in keys], sa.BigInteger),
        ([ids.get(tp) for tp, _ in keys], sa.Text),
    )
    rows = (
        sa.func.unnest(*(sa.cast(sa.literal(values, ARRAY(kind)), ARRAY(kind)) for values, kind in arrays))
        .table_valued("topic", "part", "off", "topic_id")
        .render_derived()
    )
    cols = ["job", "topic", "part", "off", "topic_id"]
    stmt = (
        pg_insert(t.offsets)
        .from_select(cols, sa.select(sa.literal(job), rows.c.topic, rows.c.part, rows.c.off, rows.c.topic_id))
        .on_conflict_do_nothing(index_elements=["job", "topic", "part"])
        .returning(t.offsets.c.topic, t.offsets.c.part, t.offsets.c.off)
    )
    inserted = {(r.topic, r.part): r.off for r in conn.execute(stmt)}
    changes = [OffsetChange(tp, p, None, off) for (tp, p), off in sorted(inserted.items())]
    write_audit(
        conn, db, job, changes, action=action, reason=reason, actor=actor, generation=state.generation
    )
    if inserted:
        logger.info("job %r: seeded %r partitions (%r)", job, len(inserted), action)
    return inserted


def reread(
    conn: sa.Connection, db: DatabaseSettings, job: str, keys: Sequence[TopicPartition], *, lock: bool = True
) -> tuple[dict[TopicPartition, int | None], int | None]:
    """The rows' offsets (None: no row) and the job's generation (None: no job).

    With `lock`, the rows are read FOR UPDATE: that waits until any transaction still holding
    them (a COMMIT whose client vanished) has ended, so the answer is final, not a guess.
    """
    rows, generation = reread_rows(conn, db, job, keys, lock=lock)
    return {k: None if row is None else row.off for k, row in rows.items()}, generation


def reread_rows(
    conn: sa.Connection, db: DatabaseSettings, job: str, keys: Sequence[TopicPartition], *, lock: bool = True
) -> tuple[dict[TopicPartition, StoredOffset | None], int | None]:
    """:func:`reread` with each row's topic id (None: no row)."""
    t = tables_for(db.schema)
    o = t.offsets
    stmt = sa.select(o.c.topic, o.c.part, o.c.off, o.c.topic_id).where(
        o.c.job == job, sa.tuple_(o.c.topic, o.c.part).in_(list(keys))
    )
    if lock:
        stmt = stmt.order_by(o.c.topic, o.c.part).with_for_update()
    found: dict[TopicPartition, StoredOffset | None] = dict.fromkeys(keys)
    found.update({(r.topic, r.part): StoredOffset(r.off, r.topic_id) for r in conn.execute(stmt)})
    generation = conn.execute(sa.select(t.jobs.c.generation).where(t.jobs.c.job == job)).scalar_one_or_none()
    return found, generation


def skip_lost(  # noqa: PLR0917 - positional order is the planner's contract
    conn: sa.Connection,
    db: DatabaseSettings,
    job: str,
    topic: str,
    part: int,
    old: int,
    new: int,
    reason: str,
    *,
    actor: str | None = None,
    generation: int | None = None,
    topic_id: str | None = None,
    to_new_log: bool = False,
) -> bool:
    """Move past offsets Kafka no longer has (data-loss policy 'skip'), audited. Returns False when
    the row was already moved to `new` (a retry); raises OffsetConflict if it is anywhere else.

    The job row is locked FOR KEY SHARE and the generation checked under that lock, so a run
    fenced meanwhile cannot move the offset. A skip moves forward, except onto a new log
    (``to_new_log``: the log was truncated or the topic re-created), whose offsets may be lower;
    `topic_id` then records the incarnation the offset now belongs to.
    """
    who = actor or default_actor()
    check_offsets({(topic, part): old})
    check_offsets({(topic, part): new})
    check_audit("data_loss_skip", reason, who)
    if new < old and not to_new_log:
        raise ConfigError(
            "new offset", f"{new} is below {old} for {topic}[{part}]; a skip only moves forward"
        )
    state = check_generation(conn, db, job, generation)
    o = tables_for(db.schema).offsets
    values: dict[str, object] = {"off": new, "updated_at": sa.func.now()}
    if topic_id is not None:
        values["topic_id"] = topic_id
    moved = conn.execute(
        sa.update(o)
        .where(o.c.job == job, o.c.topic == topic, o.c.part == part, o.c.off == old)
        .values(**values)
    ).rowcount
    if moved != 1:
        found, _ = reread(conn, db, job, [(topic, part)], lock=False)
        if found[(topic, part)] == new:
            return False
        raise OffsetConflict(job, topic, part, old, found[(topic, part)])
    change = OffsetChange(topic, part, old, new)
    write_audit(
        conn,
        db,
        job,
        [change],
        action="data_loss_skip",
        reason=reason,
        actor=who,
        generation=state.generation,
    )
    logger.warning("job %r: data-loss skip of %s[%r]: offset %r -> %r", job, topic, part, old, new)
    return True


def reset_offsets(
    conn: sa.Connection,
    db: DatabaseSettings,
    job: str,
    targets: Mapping[TopicPartition, int],
    *,
    reason: str,
    actor: str,
    topic_ids: Mapping[str, str] | None = None,
) -> list[OffsetChange]:
    """The admin reset: set the offsets, audit each change, bump the generation and drop the lease.

    The job row is locked FOR UPDATE first, so claims in flight finish before the old values are
    read; the generation bump then fences the run that planned from them. Checking whether a live
    run may be fenced is the caller's decision (see :mod:`txn_offsets.admin.reset`).

    `topic_ids`: the Kafka topic id of each topic the new offsets were chosen against (as Kafka
    described it when the reset was planned). A row's id is set to it, so a topic deleted and
    re-created after the reset is data loss on the next plan, not the old offsets read in the new
    topic; a topic without one (no Kafka asked) stores none and the next plan adopts Kafka's.
    """
    check_offsets(targets)
    check_audit("reset", reason, actor)
    if not targets:
        raise ConfigError("reset", "no partitions selected")
    lock_job(conn, db, job)
    t = tables_for(db.schema)
    current = load_offsets(conn, db, job)
    changes = [OffsetChange(tp, p, current.get((tp, p)), off) for (tp, p), off in sorted(targets.items())]
    ids = topic_ids or {}
    upsert = pg_insert(t.offsets).values(
        [
            {"job": job, "topic": c.topic, "part": c.partition, "off": c.new, "topic_id": ids.get(c.topic)}
            for c in changes
        ]
    )
    # the new offsets belong to the incarnation the admin chose them for, not to the one the old
    # offsets were read from (or a reset after a topic was re-created would be data loss again)
    conn.execute(
        upsert.on_conflict_do_update(
            index_elements=["job", "topic", "part"],
            set_={
                "off": upsert.excluded.off,
                "updated_at": sa.func.now(),
                "topic_id": upsert.excluded.topic_id,
            },
        )
    )
    generation = conn.execute(
        sa.update(t.jobs)
        .where(t.jobs.c.job == job)
        .values(generation=t.jobs.c.generation + 1, run_id=None, lease_until=None)
        .returning(t.jobs.c.generation)
    ).scalar_one()
    write_audit(conn, db, job, changes, action="reset", reason=reason, actor=actor, generation=generation)
    logger.warning("job %r: offsets of %r partitions reset by %r", job, len(changes), actor)
    return changes
