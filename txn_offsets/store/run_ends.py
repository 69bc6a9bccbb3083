"""How a run ended, where the ``job_runs`` table's trigger cannot tell: a failure, and a takeover.

The trigger ``record_run`` on ``jobs`` (migration 0013) writes each run's row when it starts and
its end when the job row moves: released (``finished``), a newer generation taken while its lease
was live (``fenced``) or after it ran out (``lease_expired``). Two ends only the code knows:

* :func:`note_failure`: the runner stops on an error; it records the error's class and a
  one-line cause that holds no record data (:func:`failure_of`: the message of an error made of
  the store's facts alone, else the classes it was raised from), before the lease is released. A
  Fenced run's row already says who fenced it, and keeps that.
* :func:`mark_taken_over`: a start took the job over because the holder's process was provably
  gone (killed or crashed: :mod:`txn_offsets.store.holders`); the trigger saw a live lease fenced.

Each writes a row's end once (``ended IS NULL``, or the trigger's ``fenced`` for a takeover).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa

from txn_offsets.errors import TxnOffsetsError
from txn_offsets.store.handle import Store
from txn_offsets.store.schema import tables_for


class RunOf(Protocol):
    """A run (:class:`~txn_offsets.store.runs.Run`; runs.py calls this module, not the reverse)."""

    @property
    def job(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def run_id(self) -> str: ...


__all__ = ["CAUSE_CHARS", "RunOf", "failure_of", "mark_taken_over", "note_failure"]

logger = logging.getLogger(__name__)

CAUSE_CHARS = 300  # runs.cause's CHECK


#: txn_offsets' errors whose message is made of the store's and Kafka's facts alone (generations,
#: offsets, topic names, an operator's reason): their first line is the stored cause. Others may
#: carry a user's error text (BatchFailed says what failed inside the Spark job, RecordRejected
#: the decoder's complaint), which may quote record data: only the classes of their causes.
_TOLD = ("Fenced", "OffsetConflict", "DataLoss", "TopicChanged", "TopicMissing", "JobAlreadyRunning")


def failure_of(error: BaseException) -> tuple[str, str | None]:
    """The error's class (qualified outside txn_offsets) and the cause stored for it (see
    :data:`_TOLD`): the first line of the message, cut to CAUSE_CHARS; else the classes of the
    errors it was raised from (``caused by RuntimeError``); else None."""
    name = _class_of(error)
    if isinstance(error, TxnOffsetsError) and type(error).__name__ in _TOLD:
        lines = str(error).strip().splitlines()
        first = lines[0] if lines else ""
        return name, (first[: CAUSE_CHARS - 1] + "\u2026" if len(first) > CAUSE_CHARS else first) or None
    chain: list[str] = []
    seen = error.__cause__ or error.__context__
    while seen is not None and len(chain) < 4:
        chain.append(_class_of(seen))
        seen = seen.__cause__ or seen.__context__
    return name, ("caused by " + " <- ".join(chain))[:CAUSE_CHARS] if chain else None


def _class_of(error: BaseException) -> str:
    kind = type(error)
    ours = kind.__module__ in {"builtins", "txn_offsets"} or kind.__module__.startswith("txn_offsets.")
    return kind.__qualname__ if ours else f"{kind.__module__}.{kind.__qualname__}"


def note_failure(store: Store, run: RunOf, error: BaseException) -> None:
    """Record that `run` stopped on `error` (class and cause, :func:`failure_of`), unless its end is
    known already (a fence). Quiet: the error in flight is the one that matters."""
    name, cause = failure_of(error)
    r = store.tables.runs
    stmt = (
        sa.update(r)
        .where(
            r.c.job == run.job,
            r.c.generation == run.generation,
            r.c.run_id == run.run_id,
            r.c.ended.is_(None),
        )
        .values(ended="failed", ended_at=sa.func.now(), error_class=name, cause=cause)
    )
    try:
        with store.begin() as conn:
            conn.execute(stmt)
    except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
        logger.warning(
            "job %r: could not record how run %r ended: %s", run.job, run.run_id, type(exc).__name__
        )


def mark_taken_over(conn: sa.Connection, schema: str, gone: Sequence[tuple[str, int, str]]) -> None:
    """In the start's transaction, after its bump: the runs (job, generation, run id) whose holder
    was provably gone are ``holder_gone``, not ``fenced``."""
    r = tables_for(schema).runs
    for job, generation, run_id in gone:
        conn.execute(
            sa.update(r)
            .where(r.c.job == job, r.c.generation == generation, r.c.run_id == run_id, r.c.ended == "fenced")
            .values(ended="holder_gone")
        )
