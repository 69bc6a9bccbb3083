"""The one owner of a batch's transaction: begin, claim every range, write, commit — or classify.

Both writers (a task's ranges in the executor, or one whole batch on the driver) call
:func:`commit_ranges`. The ranges are claimed FIRST, all in one statement that locks their rows in
(topic, partition) order (:func:`txn_offsets.store.claims.claim_ranges`), so two transactions
touching the same partitions cannot deadlock and a duplicate attempt blocks on its first row
before it has written anything; the same statement inserts the ranges' lineage rows.

When the transaction ends without a clear answer, the outcome is never guessed. A lost
connection during COMMIT, a serialization failure (40001, REPEATABLE READ/SERIALIZABLE) or a
deadlock (40P01) is resolved by re-reading the rows on a fresh connection with ``FOR UPDATE``,
which waits for any transaction still holding them, then classifying
(:func:`txn_offsets.store.offset_rows.classify_reread`).
"""

from __future__ import annotations

import enum
import itertools
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import (
    ClaimBlocked,
    CommitNotApplied,
    ConfigError,
    ServiceUnavailable,
    TransactionAborted,
    WriteFailed,
)
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import claims, classify, offset_rows
from txn_offsets.store import lineage as lineage_rows
from txn_offsets.store.database import (
    is_connection_lost,
    is_lock_timeout,
    is_retryable,
    is_statement_timeout,
    sqlstate,
    translate_errors,
)
from txn_offsets.store.runs import Run

__all__ = [
    "ISOLATION_LEVELS",
    "Outcome",
    "RangeOutcome",
    "TransactionWrite",
    "commit_ranges",
    "is_aborted",
    "settle_lost_commit",
    "validate",
]

logger = logging.getLogger(__name__)

ISOLATION_LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")

# what the transaction runs after its claims, on its connection (not spark.writers.Writer, the
# writer that run_job takes)
TransactionWrite = Callable[[sa.Connection], None]


class Outcome(enum.StrEnum):
    """What happened to a range. Both are success: the range's records are applied exactly once."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


@dataclass(frozen=True)
class RangeOutcome:
    range: OffsetRange
    outcome: Outcome


_ALREADY = classify.ClaimResult.ALREADY_COMMITTED


class _Retry(Exception):
    """Internal: the attempt was rolled back by Postgres and nothing was committed."""


def validate(
    run: Run, ranges: Sequence[OffsetRange], isolation_level: str, max_attempts: int
) -> list[OffsetRange]:
    if not isinstance(run, Run):
        raise ConfigError("run", f"expected a txn_offsets.store.runs.Run, got {type(run).__name__}")
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError("isolation_level", f"{isolation_level!r}: use one of {', '.join(ISOLATION_LEVELS)}")
    if max_attempts < 1:
        raise ConfigError("max_attempts", f"must be >= 1, got {max_attempts}")
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


def _describe(ranges: Sequence[OffsetRange]) -> str:
    shown = ", ".join(str(r) for r in ranges[:5])
    return shown + (f" (+{len(ranges) - 5} more)" if len(ranges) > 5 else "")


def commit_ranges(
    engine: sa.Engine,
    db: DatabaseSettings,
    run: Run,
    ranges: Sequence[OffsetRange],
    write: TransactionWrite | None = None,
    *,
    isolation_level: str = "READ COMMITTED",
    max_attempts: int = 3,
    guard: bool = True,
    lineage: lineage_rows.Lineage | None = None,
) -> list[RangeOutcome]:
    """Claim `ranges`, run `write(conn)` in the same transaction, commit; outcomes in range order.

    One statement claims every range and, once all are claimed, inserts their ``commits`` rows
    (the lineage; `lineage` adds the batch number and record timestamps when the caller knows
    them): with the write and BEGIN/COMMIT, four round trips however many ranges there are.

    ``guard=False`` is for benchmarks only: the same transaction without the claim, so nothing
    protects or records the ranges (at-least-once). It measures what the guard costs.

    * every range already committed: roll back, `write` is never called, all ALREADY_COMMITTED;
    * some claimed and some already committed, or any other offset: roll back, OffsetConflict;
    * a newer generation of the job exists: roll back, Fenced;
    * rolled back by Postgres (40001/40P01) with nothing committed: retried up to `max_attempts`
      in all, then CommitNotApplied; a connection lost during COMMIT: re-read, never guessed.
    """
    ordered = validate(run, ranges, isolation_level, max_attempts)
    for attempt in range(1, max_attempts + 1):
        try:
            outcome = _attempt(
                engine,
                db,
                run,
                ordered,
                write=write,
                isolation_level=isolation_level,
                guard=guard,
                lineage=lineage,
            )
        except _Retry as exc:
            if attempt == max_attempts:
                raise CommitNotApplied(run.job, _describe(ordered), str(exc)) from None
            logger.info("job %r: attempt %r rolled back (%s); retrying", run.job, attempt, exc)
            continue
        return [RangeOutcome(r, outcome) for r in ranges]
    raise AssertionError("unreachable")  # pragma: no cover


def _attempt(
    engine: sa.Engine,
    db: DatabaseSettings,
    run: Run,
    ordered: list[OffsetRange],
    *,
    write: TransactionWrite | None,
    isolation_level: str,
    guard: bool = True,
    lineage: lineage_rows.Lineage | None = None,
) -> Outcome:
    with translate_errors(db):
        conn = engine.connect().execution_options(isolation_level=isolation_level)
    stage = "claim"
    try:
        with conn.begin() as tx:
            # our statements: a missing table or a dead server becomes one of our errors. The
            # caller's write is not translated: its errors are about its own tables.
            with translate_errors(db):  # one statement: every claim, and their lineage rows
                results = (
                    claims.claim_ranges(conn, db, run, ordered, lineage=lineage, record=db.lineage)
                    if guard
                    else []
                )
            if results and classify.transaction_outcome(run.job, ordered, results) is _ALREADY:
                tx.rollback()
                logger.info("job %r: %s already committed; nothing written", run.job, _describe(ordered))
                return Outcome.ALREADY_COMMITTED
            if write is not None:
                stage = "write"
                write(conn)
            # A write that caught a database error leaves the transaction aborted: PostgreSQL would
            # answer COMMIT with a silent ROLLBACK while we reported "committed". Never commit blind.
            if is_aborted(conn):
                raise TransactionAborted(run.job, _describe(ordered))
            stage = "commit"
        # leaving the `with` block committed the transaction
        return Outcome.COMMITTED
    except ServiceUnavailable:
        if stage != "claim":
            raise
        # The connection broke before or during the claim. COMMIT was never sent, so nothing of
        # this attempt can have been committed: typically a pooled connection that broke while
        # unused (connections in steady use are not pinged before each transaction, see
        # store.database.PING_IF_IDLE_S). The next attempt takes a fresh connection.
        raise _Retry("connection lost before the claim") from None
    except sa.exc.DBAPIError as exc:
        if is_retryable(exc):
            cause = f"rolled back by PostgreSQL, sqlstate {sqlstate(exc)}"
            return _settle(engine, db, run, ordered, cause=cause, ours_may_have_committed=False)
        if stage == "commit" and is_connection_lost(exc):
            logger.warning("job %r: connection lost during COMMIT; re-reading the offsets", run.job)
            cause = "connection lost during COMMIT"
            return _settle(engine, db, run, ordered, cause=cause, ours_may_have_committed=True)
        if stage == "claim" and (is_lock_timeout(exc) or is_statement_timeout(exc)):
            # a frozen or slow holder of the row (its session ends by its own timeouts): retryable
            raise ClaimBlocked(run.job, _describe(ordered), db.lock_timeout_s) from None
        if is_connection_lost(exc):
            raise ServiceUnavailable(
                "PostgreSQL", db.display_url, f"connection lost during the {stage}"
            ) from None
        # the user's write failed: name the error, never its text (it may quote record values)
        raise WriteFailed(
            run.job, _describe(ordered), type(exc.orig or exc).__name__, sqlstate(exc), _where(exc)
        ) from None
    finally:
        conn.close()


def is_aborted(conn: sa.Connection) -> bool:
    """True if PostgreSQL has aborted the connection's transaction (psycopg's transaction status)."""
    raw = conn.connection.dbapi_connection
    info = getattr(raw, "info", None)
    status = getattr(info, "transaction_status", None)
    return status is not None and status == psycopg.pq.TransactionStatus.INERROR


def _where(exc: sa.exc.DBAPIError) -> str:
    """What PostgreSQL said, without values: the primary message (except for data exceptions,
    class 22, whose messages quote the offending value) and the table, column and constraint. The
    DETAIL line (``Key (k)=(v) already exists``) and the statement's parameters are never shown."""
    diag = getattr(exc.orig, "diag", None)
    parts = []
    primary = getattr(diag, "message_primary", None)
    if primary and not (sqlstate(exc) or "").startswith("22"):
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


def settle_lost_commit(
    engine: sa.Engine, db: DatabaseSettings, run: Run, ranges: Sequence[OffsetRange]
) -> list[RangeOutcome]:
    """The outcome of `ranges` after a COMMIT whose answer was lost (a joint commit's, see
    :mod:`txn_offsets.store.joint_commit`), decided from their rows as commit_ranges decides its own:
    all COMMITTED, or CommitNotApplied (the rows show it did not apply), or a conflict."""
    ordered = sorted(ranges, key=lambda r: r.key)
    cause = "connection lost during COMMIT"
    outcome = _settle(engine, db, run, ordered, cause=cause, ours_may_have_committed=True)
    return [RangeOutcome(r, outcome) for r in ranges]


def _settle(
    engine: sa.Engine,
    db: DatabaseSettings,
    run: Run,
    ordered: list[OffsetRange],
    *,
    cause: str,
    ours_may_have_committed: bool,
) -> Outcome:
    """Decide the outcome from the rows themselves, on a fresh READ COMMITTED connection."""
    with translate_errors(db), engine.connect() as fresh:
        conn = fresh.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            rows, generation = offset_rows.reread_rows(conn, db, run.job, [r.key for r in ordered], lock=True)
    found = {k: None if row is None else row.off for k, row in rows.items()}
    ids = {k: None if row is None else row.topic_id for k, row in rows.items()}
    settled = offset_rows.classify_reread(
        run.job, ordered, found, generation, run.generation, found_topic_ids=ids
    )
    if settled is offset_rows.Settled.AT_UNTIL:
        # after a lost COMMIT the rows at `until` are (almost always) ours; after 40001 they are
        # a duplicate's. Either way the records are applied exactly once.
        outcome = Outcome.COMMITTED if ours_may_have_committed else Outcome.ALREADY_COMMITTED
        logger.info("job %r: %s; the offsets show %r", run.job, cause, outcome)
        return outcome
    if ours_may_have_committed:
        raise CommitNotApplied(run.job, _describe(ordered), cause)
    raise _Retry(cause)


def __getattr__(name: str) -> object:
    # the write callable's old name, kept for one release (Writer is spark.writers.Writer's name)
    if name == "Writer":
        warnings.warn(
            "txn_offsets.store.transaction.Writer is deprecated: it is TransactionWrite now",
            DeprecationWarning,
            stacklevel=2,
        )
        return TransactionWrite
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
