"""A PartitionWriter's per-range ``write`` sends its ranges' ``upsert_add`` calls as one statement
per transaction (merging_upserts), not one per range: a batch over thousands of partitions made a
round trip per range (issue 46). Counted by a statement-level trigger on the result table, which
fires once per INSERT statement; the totals stay exact (keys shared by the ranges are summed)."""

from __future__ import annotations

import collections

import sqlalchemy as sa

from tests.integration.spark.batch.test_task_transactions import transactions_per_batch
from tests.integration.spark.counting import Counting, count_keys, counts_table_of, key_of
from txn_offsets import PartitionWriter
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.upserts import upsert_add


def _count_statements(counting: Counting) -> str:
    """A table of the INSERT statements into the counting table: one row per statement, by its
    transaction."""
    schema = counting.db.schema
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{schema}".statements (txid text NOT NULL)'))
        conn.execute(
            sa.text(
                f'CREATE FUNCTION "{schema}".note_statement() RETURNS trigger LANGUAGE plpgsql AS '
                f'$$ BEGIN INSERT INTO "{schema}".statements VALUES (txid_current()::text); '
                f"RETURN NULL; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER note AFTER INSERT ON {counting.table} "
                f'FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".note_statement()'
            )
        )
    return f'"{schema}".statements'


def test_a_per_range_write_sends_one_upsert_per_transaction(counting: Counting) -> None:
    topic, expected = counting.topic(6, 1_200)  # 97 keys over 6 partitions: ranges share keys
    statements = _count_statements(counting)
    summary = counting.run(
        topic,
        limits=Limits(max_records_per_partition=100),  # 2 batches of 6 ranges, 3 per task
        read=ReadOptions(max_tasks=2),
    )
    assert counting.totals() == dict(expected)  # every shared key summed over its ranges, once
    assert counting.offsets() == counting.ends(topic, 6)
    assert summary.committed == 12 and sorted(r.records for r in summary.outcomes) == [100] * 12
    # 2 tasks of 3 ranges per batch, one transaction each: 4 transactions, one INSERT each
    # (one per range before: 12)
    assert transactions_per_batch(counting.engine, counting.db, counting.job) == {1: (6, 2), 2: (6, 2)}
    rows = counting.rows(f"SELECT txid, count(*) AS n FROM {statements} GROUP BY txid")
    assert sorted(r.n for r in rows) == [1, 1, 1, 1]


def test_a_per_range_write_reads_its_own_earlier_upserts(counting: Counting) -> None:
    """A write that reads the result table after its upsert sees that range's rows (and those of
    the ranges written before it in the transaction): held calls are sent before any statement."""
    topic, expected = counting.topic(4, 800)
    target = counts_table_of(counting.table)
    seen = f'"{counting.db.schema}".seen'
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {seen} (part int PRIMARY KEY, total bigint NOT NULL)"))

    def write(conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"])
        # what this range added is in the table already: the sum of its keys' n is at least its count
        total = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(target.c.n), 0)).where(target.c.k.in_(list(counts)))
        ).scalar_one()
        conn.execute(sa.text(f"INSERT INTO {seen} VALUES (:p, :t)"), {"p": rng.partition, "t": total})

    writer = PartitionWriter(write=write, decode=key_of, aggregate=count_keys)
    summary = counting.run(topic, writer=writer, read=ReadOptions(max_tasks=1))  # 4 ranges, 1 transaction
    assert counting.totals() == dict(expected)
    assert summary.committed == 4
    rows = counting.rows(f"SELECT part, total FROM {seen} ORDER BY part")
    assert [r.part for r in rows] == [0, 1, 2, 3]
    assert all(r.total >= 200 for r in rows)  # each range's 200 records were visible to its read
