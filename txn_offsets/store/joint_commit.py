"""The commits of many runs' units in ONE transaction: what a shared round's Spark task commits.

A unit is what :func:`txn_offsets.store.transaction.commit_ranges` commits for one run: its ranges,
claimed under its own run and generation (``off = from``, one claim statement), its write and its
lineage. :func:`commit_together` claims and writes every unit on one connection and sends ONE
COMMIT, instead of a transaction (BEGIN, claim, write, COMMIT and its WAL flush) per unit.

It is all or nothing, and only a fast path. Anything but every unit claimed and written - a range
already committed or in conflict, a fencing, a blocked claim, a write that raised, a deadlock or
serialization failure, a lost connection before COMMIT, an error answer to COMMIT - rolls the whole
transaction back (nothing of it was committed) and returns None: the caller then commits each unit
alone with ``commit_ranges``, which classifies it exactly as it always has. Only a COMMIT whose
answer was lost is decided here, from each unit's rows, as ``commit_ranges`` decides its own lost
COMMIT (:func:`txn_offsets.store.transaction.settle_lost_commit`).

Units are claimed in (job, first range) order, so two such transactions over the same jobs lock
their rows in the same order.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import claims, classify
from txn_offsets.store.database import is_connection_lost, translate_errors
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run
from txn_offsets.store.transaction import (
    Outcome,
    RangeOutcome,
    TransactionWrite,
    is_aborted,
    settle_lost_commit,
    validate,
)

__all__ = ["Settled", "Unit", "commit_together"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unit:
    """One run's ranges, write and lineage, as ``commit_ranges`` takes them."""

    run: Run
    ranges: Sequence[OffsetRange]
    write: TransactionWrite | None = None
    lineage: Lineage | None = None


#: a unit's outcome: its ranges' outcomes in its order, or (after a lost COMMIT whose rows show it
#: did not apply) the error ``commit_ranges`` would have raised
Settled = list[RangeOutcome] | TxnOffsetsError


class _Abandon(Exception):
    """Internal: roll the joint transaction back; each unit is committed alone."""


def commit_together(
    engine: sa.Engine,
    db: DatabaseSettings,
    units: Sequence[Unit],
    *,
    isolation_level: str = "READ COMMITTED",
) -> list[Settled] | None:
    """Claim and write every unit, then one COMMIT; each unit's outcome in `units`' order, or None
    when nothing was committed and each unit must be committed alone (see the module's doc)."""
    try:
        ordered = [validate(u.run, u.ranges, isolation_level, 1) for u in units]
    except TxnOffsetsError:
        return None  # committed alone, each meets its own error
    order = sorted(range(len(units)), key=lambda i: (units[i].run.job, ordered[i][0].key))
    try:
        with translate_errors(db):
            conn = engine.connect().execution_options(isolation_level=isolation_level)
    except TxnOffsetsError:
        return None
    committing = False
    try:
        tx = conn.begin()
        try:
            for i in order:
                _claim_and_write(conn, db, units[i], ordered[i])
        except Exception as exc:  # anything: nothing is committed, each unit goes alone
            _rollback(tx)
            logger.info(
                "joint commit of %d units rolled back (%s): each commits alone", len(units), _why(exc)
            )
            return None
        committing = True
        tx.commit()
    except sa.exc.DBAPIError as exc:
        if not (committing and is_connection_lost(exc)):
            # PostgreSQL answered: the transaction is rolled back, nothing of it committed
            logger.info(
                "joint commit of %d units not applied (%s): each commits alone", len(units), _why(exc)
            )
            return None
        logger.warning("joint commit of %d units: connection lost during COMMIT; re-reading", len(units))
        return [_settled(engine, db, u) for u in units]
    finally:
        conn.close()
    return [[RangeOutcome(r, Outcome.COMMITTED) for r in u.ranges] for u in units]


def _claim_and_write(
    conn: sa.Connection, db: DatabaseSettings, unit: Unit, ordered: list[OffsetRange]
) -> None:
    run = unit.run
    with translate_errors(db):
        results = claims.claim_ranges(conn, db, run, ordered, lineage=unit.lineage, record=db.lineage)
    if classify.transaction_outcome(run.job, ordered, results) is not classify.ClaimResult.CLAIMED:
        raise _Abandon(f"job {run.job!r}: ranges already committed")
    if unit.write is not None:
        unit.write(conn)
    if is_aborted(conn):
        raise _Abandon(f"job {run.job!r}: its write left the transaction aborted")


def _settled(engine: sa.Engine, db: DatabaseSettings, unit: Unit) -> Settled:
    try:
        return settle_lost_commit(engine, db, unit.run, unit.ranges)
    except TxnOffsetsError as exc:
        return exc


def _rollback(tx: sa.RootTransaction) -> None:
    # a lost connection fails the ROLLBACK: PostgreSQL rolls the transaction back itself
    with contextlib.suppress(sa.exc.DBAPIError):
        tx.rollback()


def _why(exc: BaseException) -> str:
    """The exception's type (and our own reason), never a message that could quote values."""
    return str(exc) if isinstance(exc, _Abandon) else type(exc).__name__
