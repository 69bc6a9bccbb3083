"""The guarded claim of every range of a transaction, in one statement, with their lineage.

One round trip claims all the ranges a transaction commits (a task's ranges, a batch's): the
ranges travel as bound arrays (one text parameter each: :func:`array_literal`), unnested in the
statement, and the statement

1. locks the job row ``FOR KEY SHARE`` first (an InitPlan, evaluated before any offset row is
   touched), so a new run or a reset (which lock it ``FOR UPDATE``) waits for this transaction;
2. locks the ranges' offset rows ``FOR UPDATE`` in (topic, partition) order - only when the run's
   generation is the current one - so two transactions over overlapping partitions lock them in
   the same order and cannot deadlock, and a duplicate attempt waits on its first row before it
   has written anything. Under READ COMMITTED a row locked after a wait is its newest version;
3. advances each locked row that is at its range's start (``off = from``) and of the topic
   incarnation the range was planned from to the range's end. The UPDATE is gated on ``locked``
   (a one-time filter: every row is locked, in order, before any is updated; none is when the
   generation is not current) and joins the wanted ranges only, by hash: joined to the ``locked``
   CTE as well, PostgreSQL (estimating one offsets row behind the row-level security filter)
   rescanned the CTE for every row - 16.7M comparisons, seconds, at 4,096 ranges. Under READ
   COMMITTED the UPDATE re-checks ``off`` and the topic id on the newest row version, the one
   ``locked`` holds: the same row ``locked`` returns;
4. inserts one ``commits`` row per range (the lineage, :mod:`txn_offsets.store.lineage`) only when
   every range was claimed: a transaction with any range not claimed is rolled back anyway;
5. returns one row when every range was claimed (the common case), else per range in input order
   whether it was claimed, the row it found (offset, topic id) and the job's generation: a range
   that was not claimed is classified from these exactly as a single-range claim's re-read is
   (:func:`txn_offsets.commit.classify.classify_claims`), without a second round trip; with the
   transaction's id once it wrote (``pg_current_xact_id_if_assigned``), by which a COMMIT whose
   answer was lost is told apart from another attempt's commit of the same ranges
   (:func:`txn_offsets.commit.shell.commit_units`). The per-range answer's joins and sorts run only
   when a range was not claimed (a one-time filter): at 2,048 ranges they were ~5 ms of the
   statement, and the worker's reading and classifying 2,048 rows more.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.commit.classify import ClaimResult, FoundRow, classify_claims
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.lineage import Lineage, known_ms
from txn_offsets.store.runs import Run
from txn_offsets.store.schema import tables_for

__all__ = ["Claim", "array_literal", "claim", "claim_ranges"]


@dataclass(frozen=True)
class Claim:
    """What one claim statement answered: each range's result, in order, and the transaction's id
    (None when nothing was claimed: the transaction then wrote nothing and has none)."""

    results: list[ClaimResult]
    xid: str | None


def claim_ranges(
    conn: sa.Connection,
    db: DatabaseSettings,
    run: Run,
    ranges: Sequence[OffsetRange],
    *,
    lineage: Lineage | None = None,
    record: bool = True,
) -> list[ClaimResult]:
    """:func:`claim`'s result of each range, in order."""
    return claim(conn, db, run, ranges, lineage=lineage, record=record).results


def claim(
    conn: sa.Connection,
    db: DatabaseSettings,
    run: Run,
    ranges: Sequence[OffsetRange],
    *,
    lineage: Lineage | None = None,
    record: bool = True,
) -> Claim:
    """Claim `ranges` (one statement, in the caller's transaction); the result of each, in order.

    Raises what a single-range claim raises for the first range (in the given order) that cannot
    be claimed: Fenced, UnknownJob, TopicChanged, OffsetsRolledBack, OffsetConflict. With `record`
    the ranges' ``commits`` rows are inserted by the same statement when every range was claimed.
    """
    lin = lineage or Lineage()
    stamps = [lin.timestamps.get(r.key, (None, None)) for r in ranges]
    params = {
        "job": run.job,
        "generation": run.generation,
        "run_id": run.run_id,
        "batch": lin.batch,
        "n": len(ranges),
        "topics": array_literal([r.topic for r in ranges]),
        "parts": array_literal([r.partition for r in ranges]),
        "froms": array_literal([r.start for r in ranges]),
        "untils": array_literal([r.until for r in ranges]),
        "ids": array_literal([r.topic_id for r in ranges]),
        "firsts": array_literal([known_ms(first) for first, _ in stamps]),
        "lasts": array_literal([known_ms(last) for _, last in stamps]),
    }
    rows = conn.execute(_statement(db.schema, record=record), params).all()
    if not ranges:
        return Claim([], None)
    if len(rows) == 1 and rows[0][5] == 0:  # every range claimed: one row says so, with the id
        return Claim([ClaimResult.CLAIMED] * len(ranges), rows[0][4])
    # unpacked by position (the statement's columns: claimed, off, topic_id, generation, xid, i): a
    # row's attributes are looked up by name in Python, 4 -> 0.9 ms for 2,048 rows
    found = [FoundRow(bool(claimed), off, topic_id) for claimed, off, topic_id, _, _, _ in rows]
    generation = rows[0][3] if rows else None
    # a claimed range's row is produced after its UPDATE assigned the id: take the first one given
    xid = next((r[4] for r in rows if r[4]), None)
    return Claim(classify_claims(run.job, ranges, found, generation, run.generation), xid)


@functools.lru_cache(maxsize=64)
def _statement(schema: str, *, record: bool) -> sa.TextClause:
    """The claim as text, built once per schema (the number of ranges is in the arrays, not in
    the SQL). The schema is a validated identifier (tables_for); every value is a bound parameter."""
    t = tables_for(schema)
    jobs, offsets, commits = (f'"{t.jobs.schema}".{x.name}' for x in (t.jobs, t.offsets, t.commits))
    lineage = f"""
, lineage AS (
    INSERT INTO {commits} (job, topic, part, from_off, until_off, generation, run_id, batch,
                           first_record_at, last_record_at)
    SELECT :job, c.topic, c.part, c.from_off, c.until_off, :generation, :run_id, :batch,
           c.first_at, c.last_at
    FROM claimed c
    WHERE (SELECT count(*) FROM claimed) = :n
)"""  # noqa: S608 - identifiers from a validated schema name, values bound
    sql = f"""WITH want AS (
    SELECT u.topic, u.part, u.from_off, u.until_off, u.topic_id,
           pg_catalog.to_timestamp(u.first_ms / 1000.0) AS first_at,
           pg_catalog.to_timestamp(u.last_ms / 1000.0) AS last_at, u.i
    FROM unnest(CAST(:topics AS text[]), CAST(:parts AS integer[]),
                CAST(:froms AS bigint[]), CAST(:untils AS bigint[]),
                CAST(:ids AS text[]), CAST(:firsts AS bigint[]), CAST(:lasts AS bigint[]))
        WITH ORDINALITY AS u(topic, part, from_off, until_off, topic_id, first_ms, last_ms, i)
), gen AS (
    SELECT job, generation FROM {jobs} WHERE job = :job FOR KEY SHARE
), locked AS (
    SELECT o.topic, o.part, o.off, o.topic_id FROM {offsets} o
    WHERE o.job = (SELECT g.job FROM gen g WHERE g.generation = :generation)
      AND (o.topic, o.part) IN (SELECT w.topic, w.part FROM want w)
    ORDER BY o.topic, o.part
    FOR UPDATE
), claimed AS (
    UPDATE {offsets} o SET off = w.until_off, updated_at = now()
    FROM want w
    WHERE (SELECT count(*) FROM locked) > 0
      AND o.job = :job AND o.topic = w.topic AND o.part = w.part
      AND o.off = w.from_off AND (w.topic_id IS NULL OR o.topic_id = w.topic_id)
    RETURNING o.topic, o.part, w.from_off, w.until_off, w.first_at, w.last_at
){lineage if record else ""}
SELECT true AS claimed, NULL::bigint AS off, NULL::text AS topic_id,
    (SELECT g.generation FROM gen g) AS generation,
    pg_catalog.pg_current_xact_id_if_assigned()::text AS xid, 0::bigint AS i
WHERE (SELECT count(*) FROM claimed) = :n
UNION ALL
SELECT c.topic IS NOT NULL, l.off, l.topic_id, (SELECT g.generation FROM gen g),
    pg_catalog.pg_current_xact_id_if_assigned()::text, w.i
FROM want w
LEFT JOIN claimed c ON c.topic = w.topic AND c.part = w.part
LEFT JOIN locked l ON l.topic = w.topic AND l.part = w.part
WHERE (SELECT count(*) FROM claimed) <> :n
ORDER BY i
"""  # noqa: S608 - identifiers from a validated schema name, values bound
    # the arrays travel as text (array_literal), cast by the statement
    arrays = ("topics", "parts", "froms", "untils", "ids", "firsts", "lasts")
    typed: list[sa.BindParameter[object]] = [sa.bindparam(name, type_=sa.Text) for name in arrays]
    if record:
        typed.append(sa.bindparam("batch", type_=sa.BigInteger))
    return sa.text(sql).bindparams(*typed)


def array_literal(values: Sequence[str | int | None]) -> str:
    """`values` as one PostgreSQL array literal (None: NULL; every other element double-quoted,
    backslash and double quote escaped), bound as ONE text parameter and cast by the statement:
    a string join, where binding a Python list costs psycopg's dumper per element - 15 µs each in
    a task of 2,048 ranges on a busy worker, 0.22 s of its claim's 0.7 s (py-spy, 4,096 partitions)."""
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        else:
            text = str(value)
            if '"' in text or "\\" in text:
                text = text.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'"{text}"')
    return "{" + ",".join(parts) + "}"
