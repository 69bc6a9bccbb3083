"""The Structured Streaming adapter on classic Spark and (slow variants) on a real Spark Connect server:
``readStream.format("txn_offsets")`` + the exactly-once sink give exact results with aborted
Kafka transactions, commit marker-only ranges, turn replays into no-ops, fence zombies, refuse a
foreign sink and streaming state, and honour a reset made while the query is stopped."""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.spark.batch.test_connect import produce_transactions
from tests.integration.spark.batch.test_counting_job import counts_table_of, stored_offsets, totals
from tests.integration.spark.conftest import Produce
from tests.kafka_ends import settled_ends
from tests.kafka_topics import recreate_topic
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.planner import Limits
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.spark.stream.sink import ExactlyOnceSink
from txn_offsets.store.offset_rows import reset_offsets
from txn_offsets.store.stats import load_stats
from txn_offsets.upserts import upsert_add


# the Connect variant of a test is the same planning over Spark Connect's transport: in make test
# the streaming adapter runs on a real Connect server in test_streaming_kills.py (a server killed -9
# mid-batch, exact after a new one); the Connect variants here run with the slow ones
@pytest.fixture(params=["classic", pytest.param("connect", marks=pytest.mark.slow)])
def any_spark(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


def key_counts(batch: Any) -> list[tuple[str, int]]:
    """compute_df: the batch's counts per key (a shuffle over the batch DataFrame)."""
    rows = batch.selectExpr("CAST(key AS STRING) AS k").groupBy("k").count().collect()
    return [(str(r.k), int(r["count"])) for r in rows]


def write_counts(
    table: str, conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]
) -> None:
    upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])


def test_stream_is_exact_with_aborted_transactions_and_marker_only_ranges(
    any_spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=3)
    expected = produce_transactions(kafka, topic, 3)  # ends with a marker-only range on partition 0
    ends = settled_ends(kafka, topic, 3)
    with open_stream(
        any_spark,
        job=job_name,
        kafka=kafka,
        database=db,
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=300),
        checkpoint_root=str(tmp_path),
    ) as stream:
        records = any_spark.readStream.format("txn_offsets").option("job", job_name).load()
        query = stream.start(
            records,
            compute_df=key_counts,
            write=functools.partial(write_counts, counts_table),
            available_now=True,
        )
        query.awaitTermination(300)
        assert not query.isActive
        assert query.exception() is None
        assert stream.checkpoint_location.startswith(
            f"{tmp_path}/{db.schema}/{job_name}/generation-{stream.run.generation}-"
        )
    assert totals(engine, counts_table) == dict(expected)
    assert stored_offsets(engine, db, job_name) == ends
    # 1,045 offsets (975 visible records) capped at 300 per batch: 4 batches, every range committed
    with engine.connect() as conn:
        stats = load_stats(conn, db)[job_name]
    assert stats.batches >= 4 and stats.outcomes["already_committed"] == 0


def refuse_write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: object) -> None:
    raise AssertionError("a replayed batch must not be written")


def test_replayed_batch_is_a_no_op_and_a_zombie_query_is_fenced(
    any_spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 400, 2)
    common: dict[str, Any] = {
        "job": job_name,
        "kafka": kafka,
        "database": db,
        "topics": [topic],
        "checkpoint_root": str(tmp_path),
    }
    write = functools.partial(write_counts, counts_table)
    zombie = open_stream(any_spark, start=StartPolicy.earliest(), **common)
    query = zombie.start(compute_df=key_counts, write=write, interval_s=0.5)
    try:
        _wait_for(lambda: stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2))
        # Spark replaying the batch (a foreachBatch call for ranges already committed) writes nothing
        replay = ExactlyOnceSink(
            run=zombie.run, database=db, kafka=kafka, write=refuse_write, compute_df=key_counts
        )
        replay(any_spark.createDataFrame([], "key binary"), 99)
        assert totals(engine, counts_table) == dict(expected)
        # a new run fences the running query: its next trigger fails with Fenced, it writes nothing
        with open_stream(any_spark, force=True, **common) as newer:
            assert newer.run.generation == zombie.run.generation + 1
            expected += produce(topic, 100, 2, start=400)
            with pytest.raises(Exception, match=f"generation {zombie.run.generation} of job .* was fenced"):
                query.awaitTermination(120)
            assert not query.isActive
            newer.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
            assert newer.checkpoint_location != zombie.checkpoint_location
            assert totals(engine, counts_table) == dict(expected)
    finally:
        zombie.close()
    assert stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2)
    with engine.connect() as conn:
        stats = load_stats(conn, db)[job_name]
    assert stats.outcomes["already_committed"] == 2  # the replay's two ranges


def _wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_a_stream_written_by_another_sink_fails_instead_of_looping(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    produce(topic, 300, 1)
    with open_stream(
        spark,
        job=job_name,
        kafka=kafka,
        database=db,
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=100),
        checkpoint_root=str(tmp_path),
    ) as stream:
        # a plain foreachBatch: reads the batch, commits nothing
        query = (
            stream.records()
            .writeStream.foreachBatch(lambda df, i: df.count())
            .option("checkpointLocation", str(tmp_path / "foreign"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        with pytest.raises(Exception, match=r"the previous batch was not committed .* exactly-once sink"):
            query.awaitTermination(120)
    assert stored_offsets(engine, db, job_name) == {(topic, 0): 0}  # seeded, never moved


def test_streaming_state_and_unknown_jobs_are_refused(
    spark: Any,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    with open_stream(
        spark, job=job_name, kafka=kafka, database=db, topics=[topic], checkpoint_root=str(tmp_path)
    ) as stream:
        records = stream.records()
        for stateful, operator in [
            (records.groupBy("key").count(), "StateStoreSave"),
            (records.limit(5), "StreamingGlobalLimit"),
            (records.dropDuplicates(["key"]), "StreamingDeduplicate"),
        ]:
            with pytest.raises(ConfigError, match=rf"streaming state \(.*{operator}.*\).* compute_df"):
                stream.start(stateful, write=refuse_write)
        # a union would commit one read's ranges with two reads' results
        with pytest.raises(ConfigError, match=r"2 streaming source\(s\), 2 of them"):
            stream.start(records.union(stream.records()), write=refuse_write)
        with pytest.raises(ConfigError, match="interval_s"):
            stream.start(write=refuse_write, interval_s=600)
        other = spark.readStream.format("txn_offsets").option("job", "nope").load()
        with pytest.raises(Exception, match="open_stream in this session"):
            other.writeStream.foreachBatch(lambda df, i: None).start().awaitTermination(30)
    with pytest.raises(ConfigError, match="checkpoint_root"):
        open_stream(spark, job=job_name, kafka=kafka, database=db, topics=[topic], checkpoint_root=" ")
    # another job's stream is not this one's, even unioned with it
    with (
        open_stream(
            spark, job=job_name, kafka=kafka, database=db, topics=[topic], checkpoint_root=str(tmp_path)
        ) as a,
        open_stream(
            spark,
            job=f"{job_name}-b",
            kafka=kafka,
            database=db,
            topics=[topic],
            checkpoint_root=str(tmp_path),
        ) as b,
    ):
        with pytest.raises(ConfigError, match=r"2 streaming source\(s\), 1 of them"):
            a.start(a.records().union(b.records()), write=refuse_write)
        with pytest.raises(ConfigError, match=r"1 streaming source\(s\), 0 of them"):
            a.start(b.records(), write=refuse_write)
        # a word in a filter is not an operator
        query = a.start(a.records().filter("topic != 'Aggregate'"), write=refuse_write, interval_s=0.2)
        query.stop()


def test_a_reset_while_the_stream_is_stopped_is_honoured_on_restart(
    any_spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 200, 2)
    common: dict[str, Any] = {
        "job": job_name,
        "kafka": kafka,
        "database": db,
        "topics": [topic],
        "checkpoint_root": str(tmp_path),
    }
    write = functools.partial(write_counts, counts_table)
    with open_stream(any_spark, start=StartPolicy.earliest(), **common) as stream:
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
    assert totals(engine, counts_table) == dict(expected)
    # the operator rewinds partition 1 by 40 offsets while the stream is stopped
    with engine.begin() as conn:
        reset_offsets(conn, db, job_name, {(topic, 1): 60}, reason="replay test", actor="test")
    replayed = collections.Counter(f"k{(i * 7919) % 97}" for i in range(200) if i % 2 == 1 and i // 2 >= 60)
    with open_stream(any_spark, **common) as stream:
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
    assert totals(engine, counts_table) == dict(expected + replayed)
    assert stored_offsets(engine, db, job_name) == {(topic, 0): 100, (topic, 1): 100}


def test_a_second_query_over_the_same_stream_fails_and_the_first_stays_exact(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    expected = produce(topic, 400, 2)
    with open_stream(
        spark,
        job=job_name,
        kafka=kafka,
        database=db,
        topics=[topic],
        start=StartPolicy.earliest(),
        limits=Limits(max_records_per_batch=100),
        checkpoint_root=str(tmp_path),
    ) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(write_counts, counts_table), interval_s=0.2
        )
        _wait_for(lambda: sum(stored_offsets(engine, db, job_name).values()) > 0)
        # a side query over the same source would re-plan the batch the sink is about to commit
        side = (
            stream.records()
            .writeStream.foreachBatch(lambda df, i: None)
            .option("checkpointLocation", str(tmp_path / "side"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        with pytest.raises(Exception, match="another streaming query reads this run's stream"):
            side.awaitTermination(120)
        expected += produce(topic, 100, 2, start=400)
        _wait_for(lambda: stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2))
        assert query.isActive and query.exception() is None
    assert totals(engine, counts_table) == dict(expected)


def test_a_stream_with_nothing_to_read_waits_then_counts(
    any_spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    """Spark runs a query's first batch even with nothing to read (empty topic, caught-up restart,
    StartPolicy.latest()): it is a no-op, not a failure."""
    topic = topic_factory(partitions=2)
    common: dict[str, Any] = {
        "job": job_name,
        "kafka": kafka,
        "database": db,
        "topics": [topic],
        "checkpoint_root": str(tmp_path),
    }
    write = functools.partial(write_counts, counts_table)
    with open_stream(any_spark, start=StartPolicy.latest(), **common) as stream:
        query = stream.start(compute_df=key_counts, write=write, interval_s=0.2)
        _wait_for(lambda: query.lastProgress is not None)
        expected = produce(topic, 200, 2)
        _wait_for(lambda: stored_offsets(engine, db, job_name) == settled_ends(kafka, topic, 2))
        assert query.isActive and query.exception() is None
    with open_stream(any_spark, **common) as stream:  # caught up: nothing to read
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(120)
    assert totals(engine, counts_table) == dict(expected)


def test_a_recreated_topic_with_on_data_loss_skip_goes_on(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    counts_table: str,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    expected = produce(topic, 100, 1)
    with open_stream(
        spark,
        job=job_name,
        kafka=kafka,
        database=db,
        topics=[topic],
        start=StartPolicy.earliest(),
        on_data_loss="skip",
        checkpoint_root=str(tmp_path),
    ) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(write_counts, counts_table), interval_s=0.2
        )
        _wait_for(lambda: stored_offsets(engine, db, job_name) == {(topic, 0): 100})
        # absent for several triggers (0.2 s apart): each plans while the topic does not exist,
        # and the query must neither fail nor read anything until it exists again
        recreate_topic(kafka.bootstrap_servers, topic, 1, gone_s=2.0)
        expected += produce(topic, 30, 1, start=100)
        _wait_for(lambda: totals(engine, counts_table) == dict(expected))
        assert stored_offsets(engine, db, job_name) == {(topic, 0): 30}
        assert query.isActive and query.exception() is None


def slow_batch(batch: Any) -> list[Any]:
    """compute_df whose Spark job outlives the batch timeout (a frozen executor, as far as the sink
    can tell)."""
    return batch.selectExpr("reflect('java.lang.Thread', 'sleep', CAST(600000 AS BIGINT)) AS s").collect()


def test_a_batch_past_its_timeout_is_cancelled_and_fails_the_query(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    produce: Produce,
    job_name: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    produce(topic, 10, 1)
    common: dict[str, Any] = {"job": job_name, "kafka": kafka, "database": db, "topics": [topic]}
    older = open_stream(spark, checkpoint_root=str(tmp_path), **common)
    # a newer stream of the same job in the same session: closing the older must not unregister it
    with open_stream(
        spark, start=StartPolicy.earliest(), force=True, checkpoint_root=str(tmp_path), **common
    ) as stream:
        older.close()
        query = stream.start(compute_df=slow_batch, write=refuse_write, interval_s=0.2, batch_timeout_s=3)
        with pytest.raises(
            Exception, match=r"still running after batch_timeout_s=3s; its Spark jobs were cancelled"
        ):
            query.awaitTermination(120)
    assert stored_offsets(engine, db, job_name) == {(topic, 0): 0}
