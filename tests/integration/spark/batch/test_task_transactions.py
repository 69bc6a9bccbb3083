"""How many transactions a task makes (ReadOptions.ranges_per_transaction): all of its ranges in one
by default, one per range on request; either way each range is reported, recorded and counted once,
and a task retried after its COMMIT finds all of its ranges already committed."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import pytest
import sqlalchemy as sa

from tests.integration.spark.batch.test_job_faults import fail_first_attempt
from tests.integration.spark.counting import (
    Counting,
    count_keys,
    counts_table_of,
    key_of,
)
from txn_offsets import PartitionWriter
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.plan.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.upserts import upsert_add


def transactions_per_batch(engine: sa.Engine, db: DatabaseSettings, job: str) -> dict[int, tuple[int, int]]:
    """batch -> (ranges, transactions): lineage rows are only ever inserted, so a row's xmin is the
    id of the transaction that committed its range (the start time, committed_at, is not: two
    tasks' transactions can start in the same microsecond, which made this count flaky)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f'SELECT batch, xmin::text AS txid FROM "{db.schema}".commits WHERE job = :j'), {"j": job}
        ).all()
    ranges = collections.Counter(r.batch for r in rows)
    txids = collections.defaultdict(set)
    for r in rows:
        txids[r.batch].add(r.txid)
    return {b: (n, len(txids[b])) for b, n in sorted(ranges.items())}


@pytest.mark.parametrize(("per_transaction", "transactions"), [(None, 2), (1, 6), (2, 4)])
def test_a_task_commits_its_ranges_in_as_many_transactions_as_asked(
    counting: Counting, per_transaction: int | None, transactions: int
) -> None:
    topic, expected = counting.topic(6, 1_200)
    summary = counting.run(
        topic,
        limits=Limits(max_records_per_partition=100),  # 2 batches of 6 ranges, 3 per task
        read=ReadOptions(max_tasks=2, ranges_per_transaction=per_transaction),
    )
    assert counting.totals() == dict(expected)
    assert counting.offsets() == counting.ends(topic, 6)
    assert summary.committed == 12 and summary.already_committed == 0
    assert sorted(r.records for r in summary.outcomes) == [100] * 12  # each range's own count
    # 2 tasks of 3 ranges: 2 transactions per batch (None), 6 (one per range), 4 (2 + 1 per task)
    assert transactions_per_batch(counting.engine, counting.db, counting.job) == {
        1: (6, transactions),
        2: (6, transactions),
    }


def test_a_task_retried_after_its_commit_finds_all_its_ranges_committed(counting: Counting) -> None:
    topic, expected = counting.topic(4, 2_000)
    writer = counting.writer(after_commit=fail_first_attempt)
    summary = counting.run(topic, writer=writer, read=ReadOptions(max_tasks=2))  # 2 ranges per task
    assert counting.totals() == dict(expected)  # counted once despite the retries
    assert summary.already_committed == 4 and summary.committed == 0
    assert counting.offsets() == counting.ends(topic, 4)
    assert transactions_per_batch(counting.engine, counting.db, counting.job) == {1: (4, 2)}


def merging_writer(table: str, calls: str) -> PartitionWriter[str, collections.Counter[str]]:
    """A write_all writer: the counts of every range of the transaction merged into one upsert, and
    the number of ranges it was given noted in `calls` (in the same transaction)."""
    target = counts_table_of(table)

    def write_all(conn: sa.Connection, items: Sequence[tuple[OffsetRange, collections.Counter[str]]]) -> None:
        merged: collections.Counter[str] = collections.Counter()
        for _rng, counts in items:
            merged.update(counts)
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in merged.items()], keys=["k"], add=["n"])
        conn.execute(sa.text(f"INSERT INTO {calls} (ranges) VALUES (:n)"), {"n": len(items)})

    return PartitionWriter(write_all=write_all, decode=key_of, aggregate=count_keys)


@pytest.mark.parametrize(
    ("per_transaction", "sizes"), [(None, [3, 3, 3, 3]), (1, [1] * 12), (2, [1, 1, 2, 2] * 2)]
)
def test_write_all_gets_every_range_of_its_transaction_at_once(
    counting: Counting, per_transaction: int | None, sizes: list[int]
) -> None:
    topic, expected = counting.topic(6, 1_200)
    calls = f'"{counting.db.schema}".write_all_calls'
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {calls} (ranges int NOT NULL)"))
    summary = counting.run(
        topic,
        writer=merging_writer(counting.table, calls),
        limits=Limits(max_records_per_partition=100),  # 2 batches of 6 ranges, 3 per task
        read=ReadOptions(max_tasks=2, ranges_per_transaction=per_transaction),
    )
    assert counting.totals() == dict(expected)
    assert summary.committed == 12 and sorted(r.records for r in summary.outcomes) == [100] * 12
    assert counting.offsets() == counting.ends(topic, 6)
    with counting.engine.connect() as conn:  # one call per transaction, with all of its ranges
        got = sorted(int(n) for n in conn.execute(sa.text(f"SELECT ranges FROM {calls}")).scalars())
    assert got == sorted(sizes)


def test_a_partition_writer_takes_write_or_write_all() -> None:
    def per_range(conn: sa.Connection, rng: OffsetRange, value: object) -> None: ...

    def per_transaction(conn: sa.Connection, items: Sequence[tuple[OffsetRange, object]]) -> None: ...

    for bad in ({}, {"write": per_range, "write_all": per_transaction}):
        with pytest.raises(ConfigError, match="give exactly one of write") as info:
            PartitionWriter(**bad)  # type: ignore[arg-type]
        assert "write_all(conn, [(range, result), ...])" in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_ranges_per_transaction_must_be_a_positive_int_or_none(bad: object) -> None:
    with pytest.raises(ConfigError, match="ranges_per_transaction") as info:
        ReadOptions(ranges_per_transaction=bad)  # type: ignore[arg-type]
    assert "None for all of a task's ranges" in str(info.value)
