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

from tests.integration.spark.counting import Counting, counts_table_of, key_counts, produce_transactions
from tests.kafka_topics import recreate_topic
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
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


def write_counts(
    table: str, conn: sa.Connection, ranges: Sequence[OffsetRange], rows: list[tuple[str, int]]
) -> None:
    upsert_add(conn, counts_table_of(table), [{"k": k, "n": n} for k, n in rows], keys=["k"], add=["n"])


def test_stream_is_exact_with_aborted_transactions_and_marker_only_ranges(
    any_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(3)
    expected = produce_transactions(counting.kafka, topic, 3)  # ends with a marker-only range on partition 0
    ends = counting.ends(topic, 3)
    options = counting.stream_options(topic, tmp_path)
    limits = Limits(max_records_per_batch=300)
    with open_stream(any_spark, start=StartPolicy.earliest(), limits=limits, **options) as stream:
        records = any_spark.readStream.format("txn_offsets").option("job", counting.job).load()
        query = stream.start(
            records,
            compute_df=key_counts,
            write=functools.partial(write_counts, counting.table),
            available_now=True,
        )
        query.awaitTermination(300)
        assert not query.isActive
        assert query.exception() is None
        assert stream.checkpoint_location.startswith(
            f"{tmp_path}/{counting.db.schema}/{counting.job}/generation-{stream.run.generation}-"
        )
    assert counting.totals() == dict(expected)
    assert counting.offsets() == ends
    # 1,045 offsets (975 visible records) capped at 300 per batch: 4 batches, every range committed
    with counting.engine.connect() as conn:
        stats = load_stats(conn, counting.db)[counting.job]
    assert stats.batches >= 4 and stats.outcomes["already_committed"] == 0


def refuse_write(conn: sa.Connection, ranges: Sequence[OffsetRange], rows: object) -> None:
    raise AssertionError("a replayed batch must not be written")


def test_replayed_batch_is_a_no_op_and_a_zombie_query_is_fenced(
    any_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, expected = counting.topic(2, 400)
    common = counting.stream_options(topic, tmp_path)
    write = functools.partial(write_counts, counting.table)
    zombie = open_stream(any_spark, start=StartPolicy.earliest(), **common)
    query = zombie.start(compute_df=key_counts, write=write, interval_s=0.5)
    try:
        _wait_for(lambda: counting.offsets() == counting.ends(topic, 2))
        # Spark replaying the batch (a foreachBatch call for ranges already committed) writes nothing
        replay = ExactlyOnceSink(
            run=zombie.run,
            database=counting.db,
            kafka=counting.kafka,
            write=refuse_write,
            compute_df=key_counts,
        )
        replay(any_spark.createDataFrame([], "key binary"), 99)
        assert counting.totals() == dict(expected)
        # a new run fences the running query: its next trigger fails with Fenced, it writes nothing
        with open_stream(any_spark, force=True, **common) as newer:
            assert newer.run.generation == zombie.run.generation + 1
            expected += counting.produce(topic, 100, 2, start=400)
            with pytest.raises(Exception, match=f"generation {zombie.run.generation} of job .* was fenced"):
                query.awaitTermination(120)
            assert not query.isActive
            newer.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
            assert newer.checkpoint_location != zombie.checkpoint_location
            assert counting.totals() == dict(expected)
    finally:
        zombie.close()
    assert counting.offsets() == counting.ends(topic, 2)
    with counting.engine.connect() as conn:
        stats = load_stats(conn, counting.db)[counting.job]
    assert stats.outcomes["already_committed"] == 2  # the replay's two ranges


def _wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_a_stream_written_by_another_sink_fails_instead_of_looping(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(1, 300)
    options = counting.stream_options(topic, tmp_path)
    limits = Limits(max_records_per_batch=100)
    with open_stream(spark, start=StartPolicy.earliest(), limits=limits, **options) as stream:
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
    assert counting.offsets() == {(topic, 0): 0}  # seeded, never moved


def test_streaming_state_and_unknown_jobs_are_refused(spark: Any, counting: Counting, tmp_path: Path) -> None:
    topic, _ = counting.topic(1)
    options = counting.stream_options(topic, tmp_path)
    with open_stream(spark, **options) as stream:
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
        open_stream(spark, **{**options, "checkpoint_root": " "})
    # another job's stream is not this one's, even unioned with it
    with (
        open_stream(spark, **options) as a,
        open_stream(spark, **{**options, "job": f"{counting.job}-b"}) as b,
    ):
        with pytest.raises(ConfigError, match=r"2 streaming source\(s\), 1 of them"):
            a.start(a.records().union(b.records()), write=refuse_write)
        with pytest.raises(ConfigError, match=r"1 streaming source\(s\), 0 of them"):
            a.start(b.records(), write=refuse_write)
        # a word in a filter is not an operator
        query = a.start(a.records().filter("topic != 'Aggregate'"), write=refuse_write, interval_s=0.2)
        query.stop()


def test_a_reset_while_the_stream_is_stopped_is_honoured_on_restart(
    any_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, expected = counting.topic(2, 200)
    common = counting.stream_options(topic, tmp_path)
    write = functools.partial(write_counts, counting.table)
    with open_stream(any_spark, start=StartPolicy.earliest(), **common) as stream:
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
    assert counting.totals() == dict(expected)
    # the operator rewinds partition 1 by 40 offsets while the stream is stopped
    with counting.engine.begin() as conn:
        reset_offsets(conn, counting.db, counting.job, {(topic, 1): 60}, reason="replay test", actor="test")
    replayed = collections.Counter(f"k{(i * 7919) % 97}" for i in range(200) if i % 2 == 1 and i // 2 >= 60)
    with open_stream(any_spark, **common) as stream:
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(300)
    assert counting.totals() == dict(expected + replayed)
    assert counting.offsets() == {(topic, 0): 100, (topic, 1): 100}


def test_a_second_query_over_the_same_stream_fails_and_the_first_stays_exact(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, expected = counting.topic(2, 400)
    options = counting.stream_options(topic, tmp_path)
    limits = Limits(max_records_per_batch=100)
    with open_stream(spark, start=StartPolicy.earliest(), limits=limits, **options) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(write_counts, counting.table), interval_s=0.2
        )
        _wait_for(lambda: sum(counting.offsets().values()) > 0)
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
        expected += counting.produce(topic, 100, 2, start=400)
        _wait_for(lambda: counting.offsets() == counting.ends(topic, 2))
        assert query.isActive and query.exception() is None
    assert counting.totals() == dict(expected)


def test_a_stream_with_nothing_to_read_waits_then_counts(
    any_spark: Any, counting: Counting, tmp_path: Path
) -> None:
    """Spark runs a query's first batch even with nothing to read (empty topic, caught-up restart,
    StartPolicy.latest()): it is a no-op, not a failure."""
    topic, _ = counting.topic(2)
    common = counting.stream_options(topic, tmp_path)
    write = functools.partial(write_counts, counting.table)
    with open_stream(any_spark, start=StartPolicy.latest(), **common) as stream:
        query = stream.start(compute_df=key_counts, write=write, interval_s=0.2)
        _wait_for(lambda: query.lastProgress is not None)
        expected = counting.produce(topic, 200, 2)
        _wait_for(lambda: counting.offsets() == counting.ends(topic, 2))
        assert query.isActive and query.exception() is None
    with open_stream(any_spark, **common) as stream:  # caught up: nothing to read
        stream.start(compute_df=key_counts, write=write, available_now=True).awaitTermination(120)
    assert counting.totals() == dict(expected)


def test_a_recreated_topic_with_on_data_loss_skip_goes_on(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, expected = counting.topic(1, 100)
    options = counting.stream_options(topic, tmp_path)
    with open_stream(spark, start=StartPolicy.earliest(), on_data_loss="skip", **options) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(write_counts, counting.table), interval_s=0.2
        )
        _wait_for(lambda: counting.offsets() == {(topic, 0): 100})
        # absent for several triggers (0.2 s apart): each plans while the topic does not exist,
        # and the query must neither fail nor read anything until it exists again
        recreate_topic(counting.kafka.bootstrap_servers, topic, 1, gone_s=2.0)
        expected += counting.produce(topic, 30, 1, start=100)
        _wait_for(lambda: counting.totals() == dict(expected))
        assert counting.offsets() == {(topic, 0): 30}
        assert query.isActive and query.exception() is None


def slow_batch(batch: Any) -> list[Any]:
    """compute_df whose Spark job outlives the batch timeout (a frozen executor, as far as the sink
    can tell)."""
    return batch.selectExpr("reflect('java.lang.Thread', 'sleep', CAST(600000 AS BIGINT)) AS s").collect()


def test_a_batch_past_its_timeout_is_cancelled_and_fails_the_query(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(1, 10)
    common = counting.stream_options(topic, tmp_path)
    older = open_stream(spark, **common)
    # a newer stream of the same job in the same session: closing the older must not unregister it
    with open_stream(spark, start=StartPolicy.earliest(), force=True, **common) as stream:
        older.close()
        query = stream.start(compute_df=slow_batch, write=refuse_write, interval_s=0.2, batch_timeout_s=3)
        with pytest.raises(
            Exception, match=r"still running after batch_timeout_s=3s; its Spark jobs were cancelled"
        ):
            query.awaitTermination(120)
    assert counting.offsets() == {(topic, 0): 0}
