"""Why a run was fenced and what it had committed, read from the store when the run stops.

Every generation bump leaves a trace in the store, and the fenced run's own generation ``g`` says
which bump fenced it: the one that made ``g + 1``.

* An offsets reset and a jobs retire write their audit rows with the generation they made (``g +
  1``); an offsets import writes its rows (action ``import``) with the generation it found (``g``)
  and bumps after them - or, where it replaces offsets the job has, moves them as a reset whose
  audited reason starts with ``import from``. Each row says who (``actor``), when and why.
* A retire of a job without offset rows writes no audit row: ``jobs.retired_at`` tells, while no
  run started after it.
* A run's start writes no audit row; it sets the job row's ``run_id``, ``run_host`` and
  ``started_at``, which hold while no later bump came. After one, the newer run's id is found in
  its lineage, if it committed.

What the fenced run had committed is its lineage: the ``commits`` rows of its generation and run id
(one per range, written in the range's own transaction). Only what the store shows is said: a cause
it does not show stays None, and the message then names the possible ones.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import cast

import sqlalchemy as sa

from txn_offsets.errors import FenceCause, Fenced, FencedBy, RunCommitted
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run
from txn_offsets.store.schema import Tables

__all__ = ["explain_fence"]

logger = logging.getLogger(__name__)

#: the reason an import's moves of existing offsets are audited with (admin/imports.py's)
_IMPORT_REASON = "import from "
#: how long the explanation may take: it is read once, as the run stops
_TIMEOUT_MS = 5000
#: seconds before the run's loop began that its commits (and a newer run's) are looked for since
_MARGIN_S = 300.0


def explain_fence(store: Store, run: Run, fenced: Fenced, *, batches: int, running_s: float) -> Fenced:
    """`fenced` with what fenced `run` and what it had committed (``Fenced.by``,
    ``Fenced.committed``): `batches` the batches (epochs) the run completed, `running_s` how long
    its loop ran (its commits are no older). The error as it was when the store does not answer:
    the explanation never hides the fence."""
    try:
        with store.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT set_config('statement_timeout', :v, true)"), {"v": str(_TIMEOUT_MS)})
            since = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, running_s + _MARGIN_S)
            by = _fenced_by(conn, store.tables, run, since)
            committed = _committed(conn, store, run, batches, since)
    except Exception as exc:  # the fence is the error; its explanation is a courtesy
        logger.warning("job %r: could not read what fenced run %r: %s", run.job, run.run_id, exc)
        return fenced
    return Fenced(fenced.job, fenced.generation, fenced.current, by=by, committed=committed)


def _fenced_by(
    conn: sa.Connection, t: Tables, run: Run, since: sa.ColumnElement[datetime]
) -> FencedBy | None:
    """What made generation ``run.generation + 1`` (see the module), or None when the store does
    not show it."""
    g = run.generation
    a = t.audit
    audited = conn.execute(
        sa.select(a.c.action, a.c.actor, a.c.reason, a.c.at)
        .where(
            a.c.job == run.job,
            a.c.at >= since,  # after this run started: the (job, at) index bounds the look
            sa.or_(
                sa.and_(a.c.action.in_(("reset", "retire")), a.c.generation == g + 1),
                sa.and_(a.c.action == "import", a.c.generation == g),
            ),
        )
        .order_by(a.c.id)
        .limit(1)
    ).first()
    if audited is not None:
        cause = "import" if audited.reason.startswith(_IMPORT_REASON) else audited.action
        return FencedBy(cast(FenceCause, cause), g + 1, audited.actor, audited.at, audited.reason)
    j = t.jobs
    row = conn.execute(
        sa.select(j.c.generation, j.c.run_id, j.c.run_host, j.c.started_at, j.c.retired_at).where(
            j.c.job == run.job
        )
    ).first()
    if row is not None and row.generation == g + 1:  # the job row still shows the bump that fenced us
        if row.retired_at is not None and (row.started_at is None or row.started_at < row.retired_at):
            return FencedBy("retire", g + 1, at=row.retired_at)
        newer = row.run_id or _run_of(conn, t, run.job, g + 1, since)
        return FencedBy("run", g + 1, newer, row.started_at, host=row.run_host)
    newer = _run_of(conn, t, run.job, g + 1, since)  # overwritten since; its lineage may know it
    return FencedBy("run", g + 1, newer) if newer else None


def _run_of(
    conn: sa.Connection, t: Tables, job: str, generation: int, since: sa.ColumnElement[datetime]
) -> str | None:
    """The run id of `generation`'s run, from its lineage (None: it committed nothing)."""
    c = t.commits
    found = conn.execute(
        sa.select(c.c.run_id)
        .where(c.c.job == job, c.c.committed_at >= since, c.c.generation == generation)
        .limit(1)
    ).scalar()
    return None if found is None else str(found)


def _committed(
    conn: sa.Connection, store: Store, run: Run, batches: int, since: sa.ColumnElement[datetime]
) -> RunCommitted:
    """What `run` committed, from its lineage (by the run's own count of batches alone when the
    lineage is off)."""
    if not store.settings.lineage:
        return RunCommitted(run.run_id, batches)
    c = store.tables.commits
    rows = conn.execute(
        sa.select(
            c.c.topic,
            c.c.part,
            sa.func.count(),
            sa.func.count().filter(c.c.batch > batches),
            sa.func.max(c.c.until_off),
        )
        .where(
            c.c.job == run.job,
            c.c.committed_at >= since,
            c.c.generation == run.generation,
            c.c.run_id == run.run_id,
        )
        .group_by(c.c.topic, c.c.part)
        .order_by(c.c.topic, c.c.part)
    ).all()
    return RunCommitted(
        run.run_id,
        batches,
        ranges=sum(int(r[2]) for r in rows),
        in_flight=sum(int(r[3]) for r in rows),
        through=tuple((str(r[0]), int(r[1]), int(r[4])) for r in rows),
    )
