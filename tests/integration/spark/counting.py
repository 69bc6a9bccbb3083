"""The counting job of the Spark tests: the keyed (and transactional) records it counts, its
writer and result tables, the same count as a stream query, and `Counting`, a test's job (make and
fill topics, run the job, read its totals and stored offsets)."""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Producer

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from txn_offsets import JobSummary
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, Plan, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run
from txn_offsets.upserts import upsert_add


def key_of(record: Record) -> str:
    assert record.key is not None
    return record.key.decode()


def count_keys(keys: Iterator[str]) -> collections.Counter[str]:
    return collections.Counter(keys)


def produce_keyed(
    kafka: KafkaSettings | str, topic: str, n: int, partitions: int, keys: int = 97, start: int = 0
) -> collections.Counter[str]:
    """Records start..start+n-1 of `topic`, record i keyed k{(i * 7919) % keys} on partition
    i % partitions, all readable when it returns; the keys produced."""
    settings = KafkaSettings(kafka) if isinstance(kafka, str) else kafka
    producer = Producer({**settings.client_config(), "linger.ms": 10})
    expected: collections.Counter[str] = collections.Counter()
    for i in range(start, start + n):
        key = f"k{(i * 7919) % keys}"
        expected[key] += 1
        producer.produce(topic, key=key.encode(), value=b"1", partition=i % partitions)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    settled_ends(settings, topic, partitions)
    return expected


def create_counts(engine: sa.Engine, schema: str) -> sa.Table:
    """A new result table `"<schema>".counts(k, n)`."""
    table = sa.Table(
        "counts",
        sa.MetaData(),
        sa.Column("k", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        schema=schema,
    )
    with engine.begin() as conn:
        table.create(conn)
    return table


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


def _counts(table: str | sa.Table) -> sa.Table:
    return table if isinstance(table, sa.Table) else counts_table_of(table)


def counting_writer(table: str | sa.Table) -> PartitionWriter[str, collections.Counter[str]]:
    """The counting job's writer: adds each range's counts per key to `table` (k, n)."""
    target = _counts(table)

    def write(conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        # one additive upsert per range: arrays bound as parameters, never row by row
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"])

    return PartitionWriter(write=write, decode=key_of, aggregate=count_keys)


def key_counts(batch: Any) -> list[tuple[str, int]]:
    """compute_df: the batch's counts per key (a shuffle over the batch DataFrame)."""
    rows = batch.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
    return [(str(r.k), int(r["count"])) for r in rows]


def stream_once(spark: Any, table: sa.Table, *, timeout_s: float = 120.0, **options: Any) -> None:
    """A Structured Streaming query over the txn_offsets source (`options`: open_stream's, from the
    earliest offsets) adding its counts per key (key_counts) to `table` (k, n) until it has read
    what is there (available_now); it ended within `timeout_s`, without an error."""

    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]) -> None:
        upsert_add(conn, table, [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])

    with open_stream(spark, start=StartPolicy.earliest(), **options) as stream:
        records = spark.readStream.format("txn_offsets").option("job", options["job"]).load()
        query = stream.start(records, compute_df=key_counts, write=write, available_now=True)
        query.awaitTermination(timeout_s)
        assert not query.isActive and query.exception() is None


def totals(engine: sa.Engine, table: str | sa.Table) -> dict[str, int]:
    target = _counts(table)
    with engine.connect() as conn:
        return {str(k): int(n) for k, n in conn.execute(sa.select(target.c.k, target.c.n)).all()}


def stored_offsets(engine: sa.Engine, db: DatabaseSettings, job: str) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return offset_rows.load_offsets(conn, db, job)


def transactional_producer(kafka: KafkaSettings) -> Producer:
    """A Kafka producer with a transactional id of its own, its transactions initialised."""
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    return producer


def abort_alone(producer: Producer, topic: str) -> None:
    """An aborted transaction alone on partition 0: its range holds only an aborted record and the
    abort marker (settle the ends after it: abort_transaction returns before the marker is written)."""
    producer.begin_transaction()
    producer.produce(topic, key=b"never", value=b"1", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)


def produce_transactions(
    kafka: KafkaSettings,
    topic: str,
    partitions: int,
    *,
    transactions: int = 40,
    size: int = 25,
    keys: int = 11,
    then_abort_alone: bool = True,
) -> collections.Counter[str]:
    """`transactions` Kafka transactions of `size` records, every 10th aborted, then (by default) an
    aborted transaction alone on partition 0 (`abort_alone`); the committed keys."""
    producer = transactional_producer(kafka)
    expected: collections.Counter[str] = collections.Counter()
    for txn in range(transactions):
        abort = txn % 10 == 3  # ~10% aborted
        producer.begin_transaction()
        for i in range(size):
            key = f"k{(txn * size + i) % keys}"
            producer.produce(topic, key=key.encode(), value=b"1", partition=(txn + i) % partitions)
            if not abort:
                expected[key] += 1
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    if then_abort_alone:
        abort_alone(producer, topic)
    settled_ends(kafka, topic, partitions)  # abort_transaction returns before the markers are written
    return expected


@dataclass(frozen=True)
class Counting:
    """A test's counting job (the `counting` fixture): its job name, schema, Kafka, result table
    `table` (k, n), and the fixtures that make topics (`topic_factory`), fill them (`producer`, the
    `produce` fixture) and run it (`runner`, the `run_test_job` fixture)."""

    engine: sa.Engine
    db: DatabaseSettings
    kafka: KafkaSettings
    job: str
    table: str
    topic_factory: TopicFactory
    producer: Callable[..., collections.Counter[str]]
    runner: Callable[..., JobSummary]

    def topic(self, partitions: int, n: int = 0, **options: Any) -> tuple[str, collections.Counter[str]]:
        """A new topic of `partitions` partitions holding `n` keyed records; the keys produced."""
        topic = self.topic_factory(partitions=partitions, **options)
        return topic, self.producer(topic, n, partitions) if n else collections.Counter()

    def produce(self, topic: str, n: int, partitions: int, **options: Any) -> collections.Counter[str]:
        return self.producer(topic, n, partitions, **options)

    def writer(self, **fields: Any) -> PartitionWriter[Any, Any]:
        """The counting writer into `table`, with `fields` (decode=, after_commit=, ...) replaced."""
        return dataclasses.replace(counting_writer(self.table), **fields)

    def run(self, *topics: str, writer: Any = None, **overrides: Any) -> JobSummary:
        """run_test_job over `topics` with `writer` (default: the counting writer)."""
        return self.runner(self.writer() if writer is None else writer, topics, **overrides)

    def totals(self, table: str | None = None) -> dict[str, int]:
        return totals(self.engine, table or self.table)

    def offsets(self, job: str | None = None) -> dict[tuple[str, int], int]:
        return stored_offsets(self.engine, self.db, job or self.job)

    def rows(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        """The rows of `sql`, its "{schema}" the job's schema and `:j` the job (or params["j"])."""
        with self.engine.connect() as conn:
            result = conn.execute(sa.text(sql.format(schema=self.db.schema)), {"j": self.job, **params})
            return list(result.all())

    def ends(self, topic: str, partitions: int) -> dict[tuple[str, int], int]:
        return settled_ends(self.kafka, topic, partitions)

    def topics(
        self, n: int, partitions: int, records: int, keys: int | None = None
    ) -> tuple[list[str], list[collections.Counter[str]]]:
        """`n` new topics, then `records` keyed records in each (topic i: keys + i distinct keys,
        or the producer's default); the topics and the keys produced in each."""
        topics = [self.topic_factory(partitions=partitions) for _ in range(n)]
        options = [{} if keys is None else {"keys": keys + i} for i in range(n)]
        return topics, [self.producer(t, records, partitions, **options[i]) for i, t in enumerate(topics)]

    def tables(self, n: int, name: str = "counts") -> list[str]:
        """`n` more result tables like `table`: `"<schema>".<name>_<i>`."""
        names = [f'"{self.db.schema}".{name}_{i}' for i in range(n)]
        with self.engine.begin() as conn:
            for table in names:
                conn.execute(sa.text(f"CREATE TABLE {table} (k text PRIMARY KEY, n bigint NOT NULL)"))
        return names

    def job_options(self, table: str, topic: str, **options: Any) -> dict[str, Any]:
        """run_job's keywords (a job of run_jobs) for a counting job over `topic` into `table`, from
        the earliest offsets until caught up; `options` adds to them or overrides them."""
        return {
            "kafka": self.kafka,
            "database": self.db,
            "writer": counting_writer(table),
            "topics": [topic],
            "start": StartPolicy.earliest(),
            "until_caught_up": True,
            **options,
        }

    def assert_exact(
        self,
        topic: str,
        partitions: int,
        expected: collections.Counter[str],
        *,
        table: str | None = None,
        job: str | None = None,
    ) -> None:
        """The job's totals (in `table`) are `expected` and its stored offsets the topic's ends."""
        assert self.totals(table) == dict(expected), job
        assert self.offsets(job) == self.ends(topic, partitions), job

    def first_plan(self, engine: sa.Engine, topic: str, run: Run | None = None) -> Plan:
        """The job's first plan over `topic` from the earliest offsets (planned on `engine`, by
        `run` if given)."""
        return plan_batch(
            Store(engine, self.db),
            self.kafka,
            job=self.job,
            selection=TopicSelection((topic,)),
            start=StartPolicy.earliest(),
            limits=Limits(),
            run=run,
        )

    def stream_options(self, topic: str, checkpoint_root: Path) -> dict[str, Any]:
        """open_stream's / open_realtime's keywords for this job over `topic`."""
        return {
            "job": self.job,
            "kafka": self.kafka,
            "database": self.db,
            "topics": [topic],
            "checkpoint_root": str(checkpoint_root),
        }
