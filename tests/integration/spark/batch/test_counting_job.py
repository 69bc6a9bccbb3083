"""A counting job end to end on local Spark: per-key totals equal the oracle, offsets reach the end."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.conftest import Produce, RunTestJob
from tests.kafka_ends import settled_ends
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.reader import Record
from txn_offsets.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.runner import BatchReport
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store import offset_rows
from txn_offsets.upserts import upsert_add


def key_of(record: Record) -> str:
    assert record.key is not None
    return record.key.decode()


def count_keys(keys: Iterator[str]) -> collections.Counter[str]:
    return collections.Counter(keys)


def counts_table_of(name: str) -> sa.Table:
    """`"schema".counts` as a Core table (the fixture creates it)."""
    schema, table = (part.strip('"') for part in name.split("."))
    return sa.Table(
        table,
        sa.MetaData(),
        sa.Column("k", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger),
        schema=schema,
    )


def counting_writer(table: str) -> PartitionWriter[str, collections.Counter[str]]:
    target = counts_table_of(table)

    def write(conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        # one additive upsert per range: arrays bound as parameters, never row by row
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"])

    return PartitionWriter(write=write, decode=key_of, aggregate=count_keys)


def totals(engine: sa.Engine, table: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT k, n FROM {table}")).all()
    return {str(k): int(n) for k, n in rows}


def stored_offsets(engine: sa.Engine, db: DatabaseSettings, job: str) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return offset_rows.load_offsets(conn, db, job)


def test_counting_job_100k_over_8_partitions(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    topic = topic_factory(partitions=8)
    expected = produce(topic, 100_000, 8)
    summary = run_test_job(
        counting_writer(counts_table), [topic], limits=Limits(max_records_per_partition=5_000)
    )
    assert totals(engine, counts_table) == dict(expected)
    assert summary.records == 100_000
    assert summary.batches >= 3  # 12,500 per partition in slices of 5,000
    ends = settled_ends(kafka, topic, 8)
    assert stored_offsets(engine, db, job_name) == ends
    # a restart finds nothing to do and changes nothing
    again = run_test_job(counting_writer(counts_table), [topic], start=None)
    assert (again.batches, again.records) == (0, 0)
    assert again.generation == summary.generation + 1
    assert totals(engine, counts_table) == dict(expected)


def test_topic_pattern_reads_every_matching_topic(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
) -> None:
    prefix = f"pat{job_name[-6:]}"
    first = topic_factory(partitions=2, prefix=prefix)
    second = topic_factory(partitions=3, prefix=prefix)
    other = topic_factory(partitions=1)
    expected = produce(first, 1_000, 2) + produce(second, 1_500, 3)
    produce(other, 500, 1)
    summary = run_test_job(counting_writer(counts_table), topic_pattern=rf"{prefix}-[0-9a-f]+")
    assert summary.records == 2_500
    assert totals(engine, counts_table) == dict(expected)
    assert {topic for topic, _ in stored_offsets(engine, db, job_name)} == {first, second}


@pytest.mark.parametrize(("share", "ranges_per_batch"), [("backlog", [3, 3, 3, 3]), ("even", [3, 1, 1, 1])])
def test_a_batch_cap_shared_by_backlog_drains_every_partition_together(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    run_test_job: RunTestJob,
    share: str,
    ranges_per_batch: list[int],
) -> None:
    # a skewed topic: partition 0 holds 6,667 records, partitions 1 and 2 about 667 each
    topic = topic_factory(partitions=3)
    expected = produce(topic, 6_000, 1)
    expected += produce(topic, 2_000, 3, start=6_000)
    reports: list[BatchReport] = []
    summary = run_test_job(
        counting_writer(counts_table),
        [topic],
        limits=Limits(max_records_per_batch=2_000, batch_share=share),
        on_batch=reports.append,
    )
    assert totals(engine, counts_table) == dict(expected)
    assert summary.records == 8_000
    assert [r.records for r in reports] == [2_000] * 4
    # by backlog every batch holds a share of every partition (no tail of partition 0 alone, one
    # busy task); evenly the small partitions are drained first
    assert [r.ranges for r in reports] == ranges_per_batch
    ends = settled_ends(kafka, topic, 3)
    assert stored_offsets(engine, db, job_name) == ends
