"""The one transaction shell of the guard, for 1..N units: begin, claim, write, prove, commit - or classify.

Every mode hands its units here (:class:`~txn_offsets.commit.unit.Unit`: one run's ranges, the
write that goes with them, where their records were read). One transaction, whatever N is:

1. BEGIN; start the topic-incarnation proof of every unit (:mod:`.proof`): Kafka answers while
   the transaction claims and writes;
2. per unit, in (job, first range) order: ONE statement claims all its ranges under its own run
   and generation (``off = from``, the planned topic id) and inserts their lineage rows
   (:mod:`.claim`); then its write; then the check that PostgreSQL did not abort the transaction
   (a write that caught a database error would make COMMIT a silent ROLLBACK);
3. await the proof; COMMIT.

A transaction that ends without a clear answer is never guessed. A COMMIT whose answer was lost is
settled per unit from its rows, re-read ``FOR UPDATE`` on a fresh connection (which waits for any
transaction still holding them), and classified (:func:`.classify.classify_reread`). One unit alone
retries a transaction PostgreSQL rolled back (40001, 40P01, a connection lost before the claim)
up to ``max_attempts``. Several units together are only a fast path: anything but every unit
claimed, written and proven rolls the shared transaction back (nothing of it committed), and each
unit commits alone through this same shell, where it meets its own outcome.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import psycopg
import sqlalchemy as sa

from txn_offsets.commit.claim import claim
from txn_offsets.commit.classify import ClaimResult, Settled, classify_reread, transaction_outcome
from txn_offsets.commit.proof import start_proofs
from txn_offsets.commit.unit import ISOLATION_LEVELS, Outcome, RangeOutcome, Unit, describe
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import (
    ClaimBlocked,
    CommitNotApplied,
    ConfigError,
    ServiceUnavailable,
    TransactionAborted,
    TxnOffsetsError,
    WriteFailed,
)
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import offset_rows
from txn_offsets.store.database import (
    is_connection_lost,
    is_lock_timeout,
    is_retryable,
    is_statement_timeout,
    sqlstate,
    translate_errors,
)
from txn_offsets.store.runs import Run

__all__ = ["UnitResult", "commit_unit", "commit_units", "is_aborted"]

logger = logging.getLogger(__name__)

#: what one unit of several came to: its ranges' outcomes in its order, or what committing it
#: alone raised (nothing of it was committed)
UnitResult = list[RangeOutcome] | Exception


class _Retry(Exception):
    """Internal: the attempt was rolled back by PostgreSQL and nothing was committed."""


class _GiveWay(Exception):
    """Internal: a shared transaction rolled back; each unit commits alone."""


def commit_unit(
    engine: sa.Engine,
    db: DatabaseSettings,
    unit: Unit,
    *,
    isolation_level: str = "READ COMMITTED",
    max_attempts: int = 3,
) -> list[RangeOutcome]:
    """Commit one unit in a transaction of its own; its ranges' outcomes in its order.

    * every range already committed: roll back, the write is never called, all ALREADY_COMMITTED;
    * some claimed and some already committed, or any other offset: roll back, OffsetConflict
      (OffsetsMovedOn when this run's own straggler moved them: plan again);
    * a newer generation of the job exists: roll back, Fenced;
    * a topic re-created since the plan (the proof): roll back, TopicChanged;
    * rolled back by PostgreSQL (40001/40P01) with nothing committed: retried up to `max_attempts`
      in all, then CommitNotApplied; a connection lost during COMMIT: re-read, never guessed.
    """
    ordered = _validated(unit, isolation_level, max_attempts)
    for attempt in range(1, max_attempts + 1):
        try:
            (outcome,) = _attempt(engine, db, [unit], [ordered], isolation_level=isolation_level)
        except _Retry as exc:
            if attempt == max_attempts:
                raise CommitNotApplied(unit.run.job, describe(ordered), str(exc)) from None
            logger.info("job %r: attempt %r rolled back (%s); retrying", unit.run.job, attempt, exc)
            continue
        if isinstance(outcome, TxnOffsetsError):
            raise outcome
        return [RangeOutcome(r, outcome) for r in unit.ranges]
    raise AssertionError("unreachable")  # pragma: no cover


def commit_units(
    engine: sa.Engine,
    db: DatabaseSettings,
    units: Sequence[Unit],
    *,
    isolation_level: str = "READ COMMITTED",
    max_attempts: int = 3,
) -> list[UnitResult]:
    """Commit `units` in ONE transaction (one COMMIT for all), each unit's result in `units`' order.
    Where that gives way, nothing of it was committed and each unit commits alone (:func:`commit_unit`)."""
    shared = _together(engine, db, units, isolation_level) if len(units) > 1 else None
    if shared is not None:
        return shared
    results: list[UnitResult] = []
    for unit in units:
        try:
            results.append(
                commit_unit(engine, db, unit, isolation_level=isolation_level, max_attempts=max_attempts)
            )
        except Exception as exc:  # this unit's own outcome; the others go on
            results.append(exc)
    return results


def _together(
    engine: sa.Engine, db: DatabaseSettings, units: Sequence[Unit], isolation_level: str
) -> list[UnitResult] | None:
    try:
        ordered = [_validated(u, isolation_level, 1) for u in units]
    except TxnOffsetsError:
        return None  # committed alone, each meets its own error
    try:
        outcomes = _attempt(engine, db, units, ordered, isolation_level=isolation_level)
    except Exception as exc:  # anything: nothing is committed, each unit goes alone
        logger.info("shared commit of %d units rolled back (%s): each commits alone", len(units), _why(exc))
        return None
    return [
        o if isinstance(o, TxnOffsetsError) else [RangeOutcome(r, o) for r in u.ranges]
        for u, o in zip(units, outcomes, strict=True)
    ]


def _validated(unit: Unit, isolation_level: str, max_attempts: int) -> list[OffsetRange]:
    """The unit's ranges in (topic, partition) order, after checking what the shell is given."""
    if not isinstance(unit, Unit):
        raise ConfigError("unit", f"expected a txn_offsets.commit.Unit, got {type(unit).__name__}")
    if not isinstance(unit.run, Run):
        raise ConfigError("run", f"expected a txn_offsets.store.runs.Run, got {type(unit.run).__name__}")
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError("isolation_level", f"{isolation_level!r}: use one of {', '.join(ISOLATION_LEVELS)}")
    if max_attempts < 1:
        raise ConfigError("max_attempts", f"must be >= 1, got {max_attempts}")
    ranges = unit.ranges
    if isinstance(ranges, OffsetRange) or not ranges:
        raise ConfigError("ranges", "give a non-empty sequence of OffsetRange (empty ranges are not run)")
    bad = [r for r in ranges if not isinstance(r, OffsetRange)]
    if bad:
        raise ConfigError("ranges", f"{bad[0]!r} is not an OffsetRange")
    ordered = sorted(ranges, key=lambda r: r.key)
    for a, b in itertools.pairwise(ordered):
        if a.key == b.key:
            raise ConfigError("ranges", f"{a.topic}[{a.partition}] appears twice in one batch: {a} and {b}")
    return ordered


def _attempt(
    engine: sa.Engine,
    db: DatabaseSettings,
    units: Sequence[Unit],
    ordered: Sequence[list[OffsetRange]],
    *,
    isolation_level: str,
) -> list[Outcome | TxnOffsetsError]:
    """One transaction over `units`: each unit's outcome (an error only where a lost COMMIT was
    settled against it). Alone, what PostgreSQL said is classified here; together, anything but a
    clean COMMIT (or a lost one) raises and the caller commits each unit alone."""
    shared = len(units) > 1
    proof = start_proofs([(u.source, o) for u, o in zip(units, ordered, strict=True)])
    order = sorted(range(len(units)), key=lambda i: (units[i].run.job, ordered[i][0].key))
    with translate_errors(db):
        conn = engine.connect().execution_options(isolation_level=isolation_level)
    stage, current = "claim", 0
    xid: str | None = None  # this transaction's id, once a claim wrote: a lost COMMIT is looked up by it
    try:
        with conn.begin() as tx:
            for current in order:
                unit, ranges = units[current], ordered[current]
                stage = "claim"
                # our statements: a missing table or a dead server becomes one of our errors. The
                # caller's write is not translated: its errors are about its own tables.
                with translate_errors(db):  # one statement: every claim of the unit, and its lineage
                    claimed = claim(conn, db, unit.run, ranges, lineage=unit.lineage, record=db.lineage)
                results, xid = claimed.results, claimed.xid or xid
                if transaction_outcome(unit.run.job, ranges, results) is ClaimResult.ALREADY_COMMITTED:
                    if shared:
                        raise _GiveWay(f"job {unit.run.job!r}: ranges already committed")
                    tx.rollback()
                    logger.info(
                        "job %r: %s already committed; nothing written", unit.run.job, describe(ranges)
                    )
                    return [Outcome.ALREADY_COMMITTED]
                if unit.write is not None:
                    stage = "write"
                    unit.write(conn)
                if is_aborted(conn):
                    raise TransactionAborted(unit.run.job, describe(ranges))
            stage = "proof"
            proof.wait()  # TopicChanged: the records read are not the planned topic's; roll back
            stage = "commit"
        # leaving the `with` block committed the transaction
        return [Outcome.COMMITTED] * len(units)
    except ServiceUnavailable:
        if stage != "claim" or shared:
            raise
        # The connection broke before or during the claim. COMMIT was never sent, so nothing of
        # this attempt can have been committed: typically a pooled connection that broke while
        # unused (connections in steady use are not pinged before each transaction, see
        # store.database.PING_IF_IDLE_S). The next attempt takes a fresh connection.
        raise _Retry("connection lost before the claim") from None
    except Exception as raised:
        # what PostgreSQL said, through SQLAlchemy or straight from the driver (a write on the raw
        # DBAPI cursor): classified alike, so no driver error leaves with its text (it may quote values)
        exc = _as_dbapi(raised)
        if exc is None:
            raise
        if stage == "commit" and is_connection_lost(exc):
            logger.warning("%s: connection lost during COMMIT; re-reading the offsets", _who(units))
            return [
                _settled(engine, db, u.run, o, cause="connection lost during COMMIT", ours=True, xid=xid)
                for u, o in zip(units, ordered, strict=True)
            ]
        if shared:
            raise  # PostgreSQL answered: the shared transaction is rolled back, nothing committed
        run, ranges = units[0].run, ordered[0]
        if is_retryable(exc):
            cause = f"rolled back by PostgreSQL, sqlstate {sqlstate(exc)}"
            outcome = _settled(engine, db, run, ranges, cause=cause, ours=False)
            if isinstance(outcome, TxnOffsetsError):
                raise outcome from None
            return [outcome]
        if stage == "claim" and (is_lock_timeout(exc) or is_statement_timeout(exc)):
            # a frozen or slow holder of the row (its session ends by its own timeouts): retryable
            raise ClaimBlocked(run.job, describe(ranges), db.lock_timeout_s) from None
        if is_connection_lost(exc):
            raise ServiceUnavailable(
                "PostgreSQL", db.display_url, f"connection lost during the {stage}"
            ) from None
        # the user's write failed: name the error, never its text (it may quote record values)
        name = getattr(exc.orig, "driver_error", None) or type(exc.orig or exc).__name__
        raise WriteFailed(run.job, describe(ranges), name, sqlstate(exc), _where(exc)) from None
    finally:
        conn.close()


def is_aborted(conn: sa.Connection) -> bool:
    """True if PostgreSQL has aborted the connection's transaction (psycopg's transaction status)."""
    raw = conn.connection.dbapi_connection
    info = getattr(raw, "info", None)
    status = getattr(info, "transaction_status", None)
    return status is not None and status == psycopg.pq.TransactionStatus.INERROR


#: the SQLSTATEs whose primary message names only objects, never a value: a unique, foreign-key,
#: not-null, check or exclusion violation ("duplicate key value violates unique constraint "k"": the
#: values are in the DETAIL line), a missing table, column or function, a permission denied, a
#: statement after an error. Every other message may quote what the write sent (a data exception's
#: "invalid input syntax for type integer: "<value>"", a syntax error's "at or near "<fragment>"",
#: a trigger's RAISE with NEW's columns): only its SQLSTATE and object names are shown.
VALUE_FREE_MESSAGES = frozenset(
    {"23502", "23503", "23505", "23514", "23P01", "42P01", "42703", "42883", "42501", "25P02"}
)


def _as_dbapi(exc: BaseException) -> sa.exc.DBAPIError | None:
    """`exc` as SQLAlchemy wraps a driver error: itself, or a raw driver error (psycopg's, or any
    driver's that carries a SQLSTATE) wrapped; None for anything else (the caller's own errors)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return exc
    if not isinstance(exc, Exception):
        return None
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if not isinstance(exc, psycopg.Error) and not isinstance(code, str):
        return None
    if isinstance(code, str) and getattr(exc, "sqlstate", None) is None:
        exc = _WithState(code, exc)  # sqlstate() reads orig.sqlstate
    wrapped = sa.exc.DBAPIError.instance(None, None, exc, psycopg.Error, hide_parameters=True)
    return wrapped if isinstance(wrapped, sa.exc.DBAPIError) else sa.exc.DBAPIError(None, None, exc)


class _WithState(Exception):
    """A driver error whose SQLSTATE has another name (psycopg2's pgcode), seen as psycopg's."""

    def __init__(self, code: str, orig: Exception) -> None:
        super().__init__(type(orig).__name__)
        self.sqlstate = code
        self.diag = getattr(orig, "diag", None)
        self.driver_error = type(orig).__name__


def _where(exc: sa.exc.DBAPIError) -> str:
    """What PostgreSQL said, without values: the primary message only for the SQLSTATEs whose
    messages hold none (:data:`VALUE_FREE_MESSAGES`), and the table, column and constraint. The
    DETAIL line (``Key (k)=(v) already exists``) and the statement's parameters are never shown."""
    diag = getattr(exc.orig, "diag", None)
    parts = []
    primary = getattr(diag, "message_primary", None)
    if primary and sqlstate(exc) in VALUE_FREE_MESSAGES:
        parts.append(str(primary))
    for label, attr in (
        ("table", "table_name"),
        ("column", "column_name"),
        ("constraint", "constraint_name"),
    ):
        value = getattr(diag, attr, None)
        if value:
            parts.append(f"{label} {value}")
    return "; ".join(parts)


def _settled(
    engine: sa.Engine,
    db: DatabaseSettings,
    run: Run,
    ordered: list[OffsetRange],
    *,
    cause: str,
    ours: bool,
    xid: str | None = None,
) -> Outcome | TxnOffsetsError:
    """Decide a unit's outcome from its rows, on a fresh READ COMMITTED connection. `ours`: this
    attempt's COMMIT may have applied (its answer was lost; `xid` its transaction); else
    PostgreSQL rolled it back."""
    status: str | None = None
    try:
        with translate_errors(db), engine.connect() as fresh:
            conn = fresh.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                rows, generation = offset_rows.reread_rows(
                    conn, db, run.job, [r.key for r in ordered], lock=True
                )
            if ours and xid is not None:
                status = _xact_status(conn, xid)
        found = {k: None if row is None else row.off for k, row in rows.items()}
        ids = {k: None if row is None else row.topic_id for k, row in rows.items()}
        settled = classify_reread(run.job, ordered, found, generation, run.generation, found_topic_ids=ids)
    except TxnOffsetsError as exc:
        return exc
    if settled is Settled.AT_UNTIL:
        # after 40001 the rows at `until` are a duplicate's. After a lost COMMIT they are ours if
        # PostgreSQL says our transaction committed, another attempt's if it says ours aborted (a
        # task cut off inside its transaction, retried elsewhere); without an answer (the id is
        # too old, or from before a failover), ours as the rows suggest. Either way the records
        # are applied exactly once: only the report depends on it.
        outcome = Outcome.ALREADY_COMMITTED if not ours or status == "aborted" else Outcome.COMMITTED
        logger.info("job %r: %s; the offsets show %r", run.job, cause, outcome)
        return outcome
    if ours:
        return CommitNotApplied(run.job, describe(ordered), cause)
    raise _Retry(cause)


def _xact_status(conn: sa.Connection, xid: str) -> str | None:
    """PostgreSQL's word on transaction `xid` (committed / aborted / in progress), None when it
    cannot say (too old to know, or an id of another timeline after a failover: an error)."""
    try:
        with conn.begin():
            status = conn.execute(
                sa.text("SELECT pg_catalog.pg_xact_status(CAST(:xid AS xid8))"), {"xid": xid}
            ).scalar_one()
    except sa.exc.DBAPIError:
        logger.info("the status of the transaction whose COMMIT was lost is unknown; settled from the rows")
        return None
    return str(status) if status is not None else None


def _who(units: Sequence[Unit]) -> str:
    return f"job {units[0].run.job!r}" if len(units) == 1 else f"shared commit of {len(units)} units"


def _why(exc: BaseException) -> str:
    """The exception's type (and our own reason), never a message that could quote values."""
    return str(exc) if isinstance(exc, _GiveWay) else type(exc).__name__
