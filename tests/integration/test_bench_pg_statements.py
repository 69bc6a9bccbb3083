"""benchmarks.pg_statements on the local stack's PostgreSQL: the stack loads pg_stat_statements and
creates it in the project's database, and a transaction as a PartitionWriter task commits it - the
guarded claim, a per-range write staged by COPY and merged, COMMIT - shows up under those kinds."""

from __future__ import annotations

import sqlalchemy as sa

from benchmarks import pg_statements
from tests.integration.conftest import Ctx
from tests.integration.helpers import offsets_of, seed
from txn_offsets.commit import claim as claims
from txn_offsets.commit.classify import ClaimResult
from txn_offsets.ranges import OffsetRange
from txn_offsets.upserts import COPY_MIN_ROWS, upsert_add

PARTS = COPY_MIN_ROWS + 100  # the write takes the COPY path


def test_a_task_s_transaction_is_counted_by_kind(ctx: Ctx) -> None:
    table = sa.Table(
        "pg_kinds",
        sa.MetaData(schema=ctx.db.schema),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("n", sa.BigInteger),
    )
    table.create(ctx.engine)
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", p): 0 for p in range(PARTS)})
    ranges = [OffsetRange("t", p, 0, 2) for p in range(PARTS)]
    before = pg_statements.snapshot(ctx.engine)
    assert before is not None, (
        "this PostgreSQL does not keep pg_stat_statements: load it (shared_preload_libraries) and "
        "CREATE EXTENSION pg_stat_statements in the database, as make stack-up and docker-compose.yml do"
    )
    with ctx.engine.begin() as conn:
        results = claims.claim_ranges(conn, ctx.db, ctx.run, ranges)
        assert set(results) == {ClaimResult.CLAIMED}
        rows = [{"topic": r.topic, "part": r.partition, "n": 2} for r in ranges]
        assert upsert_add(conn, table, rows, keys=["topic", "part"], add=["n"]) == PARTS
    after = pg_statements.snapshot(ctx.engine)
    assert after is not None
    spent = pg_statements.used(before, after)
    # other tests run beside this one: their statements may add to any kind, never take away
    for kind in ("claim", "write: staging", "write: copy", "write: merge", "commit"):
        assert spent.get(kind, 0.0) > 0.0, (kind, spent)
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", p): 2 for p in range(PARTS)}
    with ctx.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.sum(table.c.n))).scalar_one() == 2 * PARTS


def test_the_claim_and_the_bookkeeping_are_told_apart() -> None:
    text = str(claims._statement("txn_offsets", record=True))
    assert pg_statements.kind(text) == "claim"
    assert pg_statements.kind(str(claims._statement("txn_offsets", record=False))) == "claim"
    for statement, kind in (
        ('INSERT INTO "s".job_stats (job) VALUES ($1) ON CONFLICT (job) DO NOTHING', "stats"),
        ("INSERT INTO s.counts (k, n) SELECT * FROM x ON CONFLICT (k) DO UPDATE SET n = 1", "write: merge"),
        ("WITH renewed AS (UPDATE s.jobs SET heartbeat_at = now()) SELECT 1", "lease"),
    ):
        assert pg_statements.kind(statement) == kind, statement
    assert pg_statements.kind("SELECT 1") == "other"
    assert pg_statements.kind(None) == "other"  # a statement of a role whose text this one may not see


def test_no_view_no_snapshot() -> None:
    # a database without pg_stat_statements (SQLite here: no such table)
    assert pg_statements.snapshot(sa.create_engine("sqlite://")) is None
