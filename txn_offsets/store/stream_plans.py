"""The batch a Structured Streaming query is running, shared by its source and its sink.

The ``txn_offsets`` streaming source plans a batch on the Spark driver; the exactly-once sink runs
in ``foreachBatch`` (on the client, or on the Connect server) and must commit exactly the ranges the
source read. Spark hands the sink only the batch id, so the source stores the batch's ranges here,
one row per job, and the sink loads them. The row says which run (generation) and which stream
reader planned it, and whether the batch is committed (set by the sink inside the transaction that
commits the ranges). So:

* one reader owns a generation's row: a second query over the same stream fails at its first plan
  (:func:`become_reader`) instead of replacing the batch the first query's sink is about to commit;
* a reader plans a new batch only once the previous one is committed (:func:`check_committed`): a
  stream written by another sink fails instead of re-reading the same records forever;
* the sink commits only the row it loaded (:func:`mark_committed` in the claim's transaction);
* a batch whose topic was re-created after its plan is let go without committing its ranges
  (:func:`let_go`): the source then plans from the offsets table, which still holds their starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Fenced, StreamDiverged
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.offset_rows import check_generation
from txn_offsets.store.runs import Run, lock_job
from txn_offsets.store.schema import tables_for

__all__ = [
    "StreamPlan",
    "become_reader",
    "check_committed",
    "let_go",
    "load_plan",
    "mark_committed",
    "range_rows",
    "ranges_of",
    "save_plan",
]


@dataclass(frozen=True)
class StreamPlan:
    ranges: tuple[OffsetRange, ...]
    committed: bool


def range_rows(ranges: Sequence[OffsetRange]) -> list[list[object]]:
    """Ranges as JSON rows ``[topic, partition, start, until]``, plus the planned topic id when
    known (a 5th element: the sink's incarnation check needs it)."""
    return [
        [r.topic, r.partition, r.start, r.until] + ([r.topic_id] if r.topic_id is not None else [])
        for r in ranges
    ]


def ranges_of(rows: Sequence[Sequence[object]]) -> tuple[OffsetRange, ...]:
    """The inverse of :func:`range_rows` (rows of 4 elements, from before topic ids, have none)."""
    out = []
    for row in rows:
        t, p, a, b = row[:4]
        topic_id = str(row[4]) if len(row) > 4 and row[4] is not None else None
        out.append(OffsetRange(str(t), int(str(p)), int(str(a)), int(str(b)), topic_id))
    return tuple(out)


def _owned_row(conn: sa.Connection, db: DatabaseSettings, run: Run, reader: str) -> Any:
    """The job's row FOR UPDATE (under the job row's KEY SHARE lock, generation checked); raises
    if another reader owns this generation's row."""
    check_generation(conn, db, run.job, run.generation)
    plans = tables_for(db.schema).stream_plans
    row = conn.execute(
        sa.select(plans.c.generation, plans.c.reader, plans.c.ranges, plans.c.committed)
        .where(plans.c.job == run.job)
        .with_for_update()
    ).one_or_none()
    if row is None or row.generation != run.generation:
        return None
    if row.reader != reader:
        raise StreamDiverged(
            run.job,
            run.generation,
            "another streaming query reads this run's stream: one query per open_stream (start the "
            "query with TxnStream.start, and read the source once)",
        )
    return row


def _upsert(
    conn: sa.Connection, db: DatabaseSettings, run: Run, reader: str, body: object, *, committed: bool
) -> None:
    plans = tables_for(db.schema).stream_plans
    values = {"generation": run.generation, "reader": reader, "ranges": body, "committed": committed}
    stmt = pg_insert(plans).values(job=run.job, **values)
    conn.execute(
        stmt.on_conflict_do_update(index_elements=[plans.c.job], set_={**values, "planned_at": sa.func.now()})
    )


def become_reader(store: Store, run: Run, reader: str) -> None:
    """Make `reader` the one reader of `run`'s stream (a query starting: nothing planned yet)."""
    with store.begin() as conn:
        if _owned_row(conn, store.settings, run, reader) is None:
            _upsert(conn, store.settings, run, reader, [], committed=True)


def check_committed(store: Store, run: Run, reader: str, ranges: Sequence[OffsetRange]) -> None:
    """Before planning past a batch Spark considers done: its ranges must be committed."""
    with store.begin() as conn:
        row = _owned_row(conn, store.settings, run, reader)
    if row is None or ranges_of(row.ranges) != tuple(ranges):
        raise StreamDiverged(
            run.job, run.generation, "the checkpoint's last batch is not the batch this run's source planned"
        )
    if not row.committed:
        r = ranges[0]
        raise StreamDiverged(
            run.job,
            run.generation,
            f"the previous batch was not committed ({len(ranges)} range(s), e.g. {r.topic}[{r.partition}] "
            f"{r.start}..{r.until}): write the stream with the exactly-once sink (TxnStream.start), "
            f"which commits each batch's ranges with its results",
        )


def save_plan(store: Store, run: Run, reader: str, ranges: Sequence[OffsetRange]) -> None:
    """Store `ranges` as the stream's current batch. The same batch again (Spark planning it once
    more) changes nothing; a new batch needs the previous one committed."""
    body = range_rows(ranges)
    with store.begin() as conn:
        row = _owned_row(conn, store.settings, run, reader)
        if row is not None and row.ranges == body:
            return
        if row is not None and not row.committed:
            raise StreamDiverged(
                run.job,
                run.generation,
                "a new batch was planned while the previous one is not committed: write the stream "
                "with the exactly-once sink (TxnStream.start)",
            )
        _upsert(conn, store.settings, run, reader, body, committed=False)


def load_plan(store: Store, run: Run) -> StreamPlan:
    """The batch the job's streaming query is running, as planned by `run`'s source."""
    t = store.tables
    with store.connect() as conn:
        row = conn.execute(
            sa.select(t.stream_plans.c.generation, t.stream_plans.c.ranges, t.stream_plans.c.committed).where(
                t.stream_plans.c.job == run.job
            )
        ).one_or_none()
        if row is None or row.generation != run.generation:
            state = lock_job(conn, store.settings, run.job, for_update=False)
            if state.generation != run.generation:
                raise Fenced(run.job, run.generation, state.generation)
            raise StreamDiverged(
                run.job,
                run.generation,
                "no batch planned by this run's txn_offsets source: the exactly-once sink writes only "
                "the stream of its own open_stream (TxnStream.start wires both)",
            )
    return StreamPlan(ranges_of(row.ranges), bool(row.committed))


def mark_committed(
    conn: sa.Connection, db: DatabaseSettings, run: Run, ranges: Sequence[OffsetRange]
) -> None:
    """In the transaction that commits `ranges`: mark their batch committed. Raises (so the whole
    transaction rolls back) if the stream's current batch is no longer those ranges."""
    plans = tables_for(db.schema).stream_plans
    marked = conn.execute(
        sa.update(plans)
        .where(
            plans.c.job == run.job,
            plans.c.generation == run.generation,
            plans.c.ranges
            == sa.cast(sa.literal(range_rows(ranges), plans.c.ranges.type), plans.c.ranges.type),
        )
        .values(committed=True)
    ).rowcount
    if marked != 1:
        raise StreamDiverged(
            run.job, run.generation, "the stream's current batch changed while the sink was committing it"
        )


def let_go(store: Store, run: Run, ranges: Sequence[OffsetRange]) -> None:
    """Mark the batch of `ranges` done WITHOUT committing its ranges (their offsets stay where they
    are): the sink found that a topic changed between the batch's plan and its read
    (TopicChanged), so its records must not be committed, and the query goes on. The source's
    next plan starts from the offsets table, which still holds the ranges' starts, and reports the
    re-created topic as data loss (``on_data_loss``) - as ``run_job`` does when it plans again.
    A fenced run raises Fenced instead."""
    with store.begin() as conn:
        check_generation(conn, store.settings, run.job, run.generation)
        mark_committed(conn, store.settings, run, ranges)
