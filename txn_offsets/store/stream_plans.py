"""The batch a Structured Streaming query is running, shared by its source and its sink.

The ``txn_offsets`` streaming source plans a batch on the Spark driver; the exactly-once sink runs
in ``foreachBatch`` (on the client, or on the Connect server) and must commit exactly the ranges the
source read. Spark hands the sink only the batch id, so the source stores the batch's ranges here,
one row per job, tagged with the run's generation, and the sink loads them. A query runs its
batches one after the other (the source plans batch N+1 only after the sink returned for batch N),
so the row always holds the batch the sink is writing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import StreamDiverged
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.database import translate_errors
from txn_offsets.store.offset_rows import check_generation
from txn_offsets.store.runs import Run
from txn_offsets.store.schema import tables_for

__all__ = ["load_plan", "save_plan"]


def save_plan(engine: sa.Engine, db: DatabaseSettings, run: Run, ranges: Sequence[OffsetRange]) -> None:
    """Store `ranges` as the job's current streaming batch; Fenced if `run` is not the current run."""
    plans = tables_for(db.schema).stream_plans
    body = [[r.topic, r.partition, r.start, r.until] for r in ranges]
    with translate_errors(db), engine.begin() as conn:
        check_generation(conn, db, run.job, run.generation)
        stmt = pg_insert(plans).values(job=run.job, generation=run.generation, ranges=body)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[plans.c.job],
                set_={
                    "generation": stmt.excluded.generation,
                    "ranges": stmt.excluded.ranges,
                    "planned_at": sa.func.now(),
                },
            )
        )


def load_plan(engine: sa.Engine, db: DatabaseSettings, run: Run) -> tuple[OffsetRange, ...]:
    """The ranges of the batch the job's streaming query is running, planned by `run`'s source."""
    plans = tables_for(db.schema).stream_plans
    with translate_errors(db), engine.connect() as conn:
        row = conn.execute(
            sa.select(plans.c.generation, plans.c.ranges).where(plans.c.job == run.job)
        ).one_or_none()
    if row is None or row.generation != run.generation:
        raise StreamDiverged(
            run.job,
            run.generation,
            "no batch planned by this run's txn_offsets source: the exactly-once sink writes only a "
            "stream read with spark.readStream.format('txn_offsets') by the same run "
            "(txn_offsets.spark.streaming.start_stream wires both)",
        )
    return tuple(OffsetRange(str(t), int(p), int(a), int(b)) for t, p, a, b in row.ranges)
