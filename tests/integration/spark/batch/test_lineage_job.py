"""The lineage of a real job (``commits``): every committed range once, chained per partition from
the seed to the stored offset, with its run, batch number and (PartitionWriter) record timestamps;
the planner prunes expired rows."""

from __future__ import annotations

import collections
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tests.integration.spark.batch.test_writers import batch_counts_writer
from tests.integration.spark.counting import Counting
from txn_offsets.config import DatabaseSettings
from txn_offsets.plan.planner import Limits
from txn_offsets.store import lineage


def lineage_rows(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    f"SELECT topic, part, from_off, until_off, generation, run_id, batch, first_record_at, "
                    f'last_record_at FROM "{db.schema}".commits WHERE job = :j ORDER BY id'
                ),
                {"j": job},
            )
        )


def assert_chained(rows: list[Any], stored: dict[tuple[str, int], int]) -> None:
    """Each partition's ranges appear once and chain from 0 (StartPolicy.earliest) to the stored offset."""
    ranges = [(r.topic, r.part, r.from_off, r.until_off) for r in rows]
    assert len(ranges) == len(set(ranges))
    by_tp: dict[tuple[str, int], list[tuple[int, int]]] = collections.defaultdict(list)
    for topic, part, a, b in ranges:
        by_tp[(topic, part)].append((a, b))
    assert set(by_tp) == set(stored)
    for tp, chain in by_tp.items():
        assert chain[0][0] == 0, tp
        assert all(x[1] == y[0] for x, y in itertools.pairwise(chain)), (tp, chain)
        assert chain[-1][1] == stored[tp], (tp, chain)


def test_partition_writer_job_records_each_range_once_with_batch_and_times(counting: Counting) -> None:
    topic, _ = counting.topic(2)
    before = datetime.now(UTC) - timedelta(seconds=5)
    expected = counting.produce(topic, 600, 2)
    after = datetime.now(UTC) + timedelta(seconds=5)
    limits = Limits(max_records_per_partition=100)
    summary = counting.run(topic, limits=limits)
    assert counting.totals() == dict(expected)
    rows = lineage_rows(counting.engine, counting.db, counting.job)
    stored = counting.offsets()
    assert len(rows) == summary.committed == 6  # 300 records per partition, 100 per range
    assert_chained(rows, stored)
    assert {r.generation for r in rows} == {summary.generation}
    assert len({r.run_id for r in rows}) == 1
    assert sorted(collections.Counter(r.batch for r in rows).items()) == [(1, 2), (2, 2), (3, 2)]
    for r in rows:
        assert before <= r.first_record_at <= r.last_record_at <= after

    # a second run: every row older than the retention is pruned by its first plan
    with counting.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE \"{counting.db.schema}\".commits SET committed_at = now() - interval '2 days'")
        )
    lineage.forget_prunes()
    counting.produce(topic, 200, 2, start=600)
    short = DatabaseSettings(counting.db.url, schema=counting.db.schema, lineage_retention_days=1)
    again = counting.run(topic, limits=limits, database=short)
    rows = lineage_rows(counting.engine, counting.db, counting.job)
    assert len(rows) == again.committed == 2
    assert {(r.part, r.from_off, r.until_off, r.batch) for r in rows} == {(0, 300, 400, 1), (1, 300, 400, 1)}
    assert counting.offsets() == {(topic, 0): 400, (topic, 1): 400}


def test_batch_writer_records_its_batches_without_record_times(counting: Counting) -> None:
    topic, expected = counting.topic(2, 400)
    t0 = time.monotonic()
    summary = counting.run(
        topic, writer=batch_counts_writer(counting.table), limits=Limits(max_records_per_batch=200)
    )
    assert time.monotonic() - t0 < 120
    assert counting.totals() == dict(expected)
    rows = lineage_rows(counting.engine, counting.db, counting.job)
    assert summary.batches == 2 and len(rows) == summary.committed == 4
    assert_chained(rows, counting.offsets())
    assert sorted(collections.Counter(r.batch for r in rows).items()) == [(1, 2), (2, 2)]
    assert all(r.first_record_at is None and r.last_record_at is None for r in rows)
