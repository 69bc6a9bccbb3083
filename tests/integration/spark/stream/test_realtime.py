"""Spark's real-time mode (``trigger(realTime=...)``) with the exactly-once row sink, on the shared
local session (Spark's Kafka source is on its classpath, tests/fix_spark.py): exact with aborted
Kafka transactions, while records arrive, across a restart of the query in the same run whose
checkpoint lost its epochs (Spark reads them again, the sink skips what the table has) and across a
new run (a new checkpoint, started from the table)."""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import (
    Counting,
    counts_table_of,
    produce_transactions,
    transactional_producer,
)
from tests.kafka_ends import settled_ends
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.realtime import open_realtime
from txn_offsets.upserts import upsert_add


def write_rows(table: str, conn: sa.Connection, rng: OffsetRange, rows: Sequence[Any]) -> None:
    counts = collections.Counter(bytes(r["key"]).decode() for r in rows)
    upsert_add(
        conn, counts_table_of(table), [{"k": k, "n": n} for k, n in counts.items()], keys=["k"], add=["n"]
    )


def _wait_for(what: str, condition: Callable[[], bool], query: Any, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _forget_epochs(location: str) -> int:
    """Delete the checkpoint's offset and commit logs; the number of epochs it had."""
    logs = [p for d in ("offsets", "commits") for p in Path(location, d).iterdir()]
    for path in logs:
        path.unlink()
    return len([p for p in logs if p.parent.name == "offsets" and p.name.isdigit()])


def _epochs(location: str) -> int:
    return len(list(Path(location, "commits").glob("[0-9]*")))


@pytest.mark.slow  # one query: real-time mode's 5 s first epoch + start, 65 s on the loaded 2 cores
def test_real_time_mode_smoke(spark: Any, counting: Counting, tmp_path: Path) -> None:
    """One query over a backlog with aborted transactions, exact. make test runs the sink without
    Spark (below, seconds) and the frame check; the real queries are slow tests."""
    topic, _ = counting.topic(2)
    expected = produce_transactions(counting.kafka, topic, 2)
    ends = counting.ends(topic, 2)
    options = counting.stream_options(topic, tmp_path)
    with open_realtime(spark, start=StartPolicy.earliest(), **options) as stream:
        query = stream.start(write=functools.partial(write_rows, counting.table), batch_duration="5 seconds")
        _wait_for("the backlog", lambda: counting.totals() == dict(expected), query)
    # a group ends at its last row: the markers after a partition's last record (the last commit
    # marker; on partition 0 an aborted record and its abort marker) wait for the next record
    stored = counting.offsets()
    assert all(ends[tp] - 3 <= stored[tp] <= ends[tp] for tp in ends), (stored, ends)
    assert counting.totals() == dict(expected)


@pytest.mark.slow  # three queries of 5 s epochs (real-time mode's minimum): about a minute idle
def test_real_time_mode_is_exact_across_a_replay_and_a_new_run(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(2)
    expected = produce_transactions(counting.kafka, topic, 2)  # every 10th transaction aborted
    write = functools.partial(write_rows, counting.table)
    common = counting.stream_options(topic, tmp_path)
    with open_realtime(spark, start=StartPolicy.earliest(), **common) as stream:
        assert stream.starting_offsets == {topic: {"0": 0, "1": 0}}
        query = stream.start(write=write, batch_duration="5 seconds")
        _wait_for("the backlog", lambda: counting.totals() == dict(expected), query)
        expected += counting.produce(topic, 300, 2, keys=13)  # while the query runs
        ends = counting.ends(topic, 2)
        _wait_for("the new records", lambda: counting.offsets() == ends, query)
        assert counting.totals() == dict(expected)
        query.stop()
        # a driver that died before it checkpointed its epochs: Spark's checkpoint knows none of
        # them, so the restarted query (same run, same checkpoint) reads everything again
        dropped = _forget_epochs(stream.checkpoint_location)
        assert dropped > 0
        again = stream.start(write=write, batch_duration="5 seconds")
        expected += counting.produce(topic, 100, 2, keys=13, start=300)
        ends = counting.ends(topic, 2)
        _wait_for("the replay", lambda: counting.offsets() == ends, again)
        _wait_for("the replayed epochs", lambda: _epochs(stream.checkpoint_location) >= 1, again)
        assert counting.totals() == dict(expected)  # the replayed rows were skipped
        first_run = stream.run
    # a new run: a new generation and checkpoint, started from the table
    with open_realtime(spark, **common) as newer:
        assert newer.run.generation == first_run.generation + 1
        assert newer.checkpoint_location != stream.checkpoint_location
        assert newer.starting_offsets == {topic: {str(p): o for (_, p), o in ends.items()}}
        query = newer.start(write=write, batch_duration="5 seconds")
        expected += counting.produce(topic, 100, 2, keys=13, start=400)
        ends = counting.ends(topic, 2)
        _wait_for("the new run", lambda: counting.offsets() == ends, query)
    assert counting.totals() == dict(expected)
    rows = counting.rows(
        'SELECT part, from_off, until_off FROM "{schema}".commits WHERE job = :j ORDER BY part, from_off'
    )  # the lineage: the groups chain from 0 to the end, once each
    for part in (0, 1):
        chain = [(int(r[1]), int(r[2])) for r in rows if r[0] == part]
        assert chain[0][0] == 0 and chain[-1][1] == ends[(topic, part)]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))


def test_real_time_frames_must_keep_the_rows_positions(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(1, 1)  # the topic is known to every broker before the run's preflight
    options = counting.stream_options(topic, tmp_path)
    with open_realtime(spark, start=StartPolicy.earliest(), **options) as stream:
        with pytest.raises(ConfigError, match=r"lack the column.*partition, offset"):
            stream.start(stream.records().select("key", "topic"), write=lambda *_: None)
        assert stream.query is None


@contextlib.contextmanager
def _seeded_run(counting: Counting, topic: str, job: str | None = None) -> Iterator[Any]:
    """A run of `job` (default: the counting job's) over `topic` whose first plan seeded its offset
    rows (at the log start, with the topic's id), as open_realtime starts one; the lease is released
    afterwards."""
    from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
    from txn_offsets.spark.spec import JobSpec, job_run

    job = job or counting.job
    db, kafka = counting.db, counting.kafka
    spec = JobSpec.of(job=job, topics=[topic], start=StartPolicy.earliest())
    with job_run(spec, db, kafka) as (driver, run):
        chosen = TopicSelection((topic,))
        plan_batch(driver, kafka, job=job, selection=chosen, start=spec.start, limits=Limits(), run=run)
        yield run


def _row(topic: str, partition: int, offset: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "offset": offset, "key": f"k{offset % 3}".encode()}


def _sink_maker(counting: Counting, run: Any) -> Callable[..., Any]:
    """RealTimeSink(max_rows=...) of `run` writing the counts into the counting job's table (groups of
    at most 4 rows by default, never closed by their age)."""
    from txn_offsets.spark.stream.realtime_sink import RealTimeSink

    write = functools.partial(write_rows, counting.table)

    def make(max_rows: int = 4) -> Any:
        return RealTimeSink(
            run=run,
            database=counting.db,
            kafka=counting.kafka,
            write=write,
            max_rows=max_rows,
            max_delay_s=60,
        )

    return make


def _epoch(sink: Any, topic: str, partition: int, number: int, offsets: Iterable[int]) -> None:
    """One epoch as Spark's foreach runs it: open, a row per offset, close."""
    sink.open(partition, number)
    for offset in offsets:
        sink.process(_row(topic, partition, offset))
    sink.close(None)


def test_the_sink_skips_a_replayed_epoch_and_commits_the_rest_in_groups(counting_no_spark: Counting) -> None:
    """RealTimeSink as Spark's foreach calls it (open, process per row, close), without Spark: a
    second attempt of an epoch (Spark's replay after a restart) writes only the rows past the table."""

    topic, _ = counting_no_spark.topic(2)
    counting_no_spark.produce(topic, 1, 1)
    with _seeded_run(counting_no_spark, topic) as run:  # both partitions at 0
        sink_of = _sink_maker(counting_no_spark, run)

        def epoch(offsets: range, partition: int = 0) -> None:
            _epoch(sink_of(), topic, partition, 1, offsets)

        epoch(range(10))  # 10 rows, groups of at most 4
        assert counting_no_spark.offsets()[(topic, 0)] == 10
        epoch(range(15))  # the replay: rows 0-9 skipped, 10-14 committed
        assert counting_no_spark.offsets()[(topic, 0)] == 15
        assert sum(counting_no_spark.totals().values()) == 15
        # a failed task's buffered rows are not committed
        failed = sink_of(max_rows=100)
        failed.open(0, 2)
        failed.process(_row(topic, 0, 15))
        failed.close(RuntimeError("the task failed"))
        assert counting_no_spark.offsets()[(topic, 0)] == 15
        # a partition without an offset row is named
        with pytest.raises(ConfigError, match=rf"{topic}\[7\] has no offset row"):
            epoch(range(1), partition=7)
    chain = counting_no_spark.rows(
        'SELECT from_off, until_off FROM "{schema}".commits WHERE job = :j AND part = 0 ORDER BY from_off'
    )
    assert [tuple(r) for r in chain] == [(0, 4), (4, 8), (8, 10), (10, 14), (14, 15)]


def test_the_sink_never_commits_rows_of_a_topic_created_again_under_the_same_name(
    counting_no_spark: Counting, tmp_path: Path
) -> None:
    """Spark's Kafka source, after a topic was deleted and created again under the same name, hands
    the writer the NEW topic's rows at the stored offsets. Before, the sink claimed them against the
    offset row's own topic id (always equal) and committed them as the old topic's. Now each group
    checks the topic's current id after its rows were read: TopicChanged, nothing written, the
    offset where it was."""
    from tests.integration.spark.batch.test_recreated_in_flight import RecreateOnce
    from txn_offsets.errors import TopicChanged

    topic, _ = counting_no_spark.topic(1, 6)
    with _seeded_run(counting_no_spark, topic) as run:  # the partition at 0, with the topic's id
        sink_of = _sink_maker(counting_no_spark, run)
        _epoch(sink_of(), topic, 0, 1, range(3))  # the topic the row was seeded from: committed
        assert counting_no_spark.offsets()[(topic, 0)] == 3
        RecreateOnce(counting_no_spark.kafka.bootstrap_servers, topic, str(tmp_path / "recreated"))()
        with pytest.raises(TopicChanged, match=topic):
            _epoch(sink_of(), topic, 0, 2, range(3, 6))  # rows read from the new topic at the stored offsets
        assert counting_no_spark.offsets()[(topic, 0)] == 3
        assert sum(counting_no_spark.totals().values()) == 3


def _aborted_then_committed(kafka: KafkaSettings, topic: str) -> None:
    """On partition 0: an aborted transaction of 5 records (offsets 0-4, its marker at 5), then a
    committed one of 3 (6-8, its marker at 9)."""
    producer = transactional_producer(kafka)
    for n, commit in ((5, False), (3, True)):
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, key=f"k{i}".encode(), value=b"1", partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    settled_ends(kafka, topic, 1)


def test_the_sink_refuses_a_first_row_above_the_stored_offset_with_records_in_between(
    counting_no_spark: Counting,
) -> None:
    """The loss of a frame the sink did not build: a source of the user's own starts at 'latest', so
    with 100 records in the topic and 10 new ones the sink saw rows 100-109 only, claimed from the
    stored 0 and committed [0, 110) with 10 rows - 100 records never counted. Now the first row above
    the stored offset is looked under: records in between refuse it (StreamDiverged), nothing is
    written; only markers and aborted records in between (a read_committed look finds nothing) let
    it commit."""
    from txn_offsets.errors import StreamDiverged

    topic, _ = counting_no_spark.topic(1, 110)
    with _seeded_run(counting_no_spark, topic) as run:  # the partition at 0
        sink = _sink_maker(counting_no_spark, run)()
        sink.open(0, 1)
        with pytest.raises(StreamDiverged, match=rf"first row of {topic}\[0\] is at offset 100.*stores 0"):
            for offset in range(100, 110):
                sink.process(_row(topic, 0, offset))
        sink.close(None)
        assert counting_no_spark.offsets()[(topic, 0)] == 0
        assert counting_no_spark.totals() == {}

    gapped, _ = counting_no_spark.topic(1)
    _aborted_then_committed(counting_no_spark.kafka, gapped)
    with _seeded_run(counting_no_spark, gapped, job=f"{counting_no_spark.job}-markers") as run:
        # what Spark's read_committed source hands the sink
        _epoch(_sink_maker(counting_no_spark, run)(), gapped, 0, 1, (6, 7, 8))
        assert counting_no_spark.offsets(f"{counting_no_spark.job}-markers")[(gapped, 0)] == 9
    assert sum(counting_no_spark.totals().values()) == 3


def test_a_real_time_query_reads_only_the_source_the_stream_built(
    spark: Any, counting: Counting, tmp_path: Path
) -> None:
    """start() refuses a frame read from a Kafka source of the user's own (it would start at
    'latest', not at the stored offsets), and one that mixes another source into the stream's; a
    transformation of stream.records() is accepted (it fails later only for the missing columns)."""
    topic, _ = counting.topic(1, 1)
    options = counting.stream_options(topic, tmp_path)
    with open_realtime(spark, start=StartPolicy.earliest(), **options) as stream:
        own = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", counting.kafka.bootstrap_servers)
            .option("subscribe", topic)
            .load()
        )
        with pytest.raises(ConfigError, match=r"through stream\.records\(\).*no source of this stream"):
            stream.start(own, write=lambda *_: None)
        mixed = stream.records().unionByName(own)
        with pytest.raises(ConfigError, match=r"another streaming source"):
            stream.start(mixed, write=lambda *_: None)
        with pytest.raises(ConfigError, match=r"lack the column"):  # past the source check
            stream.start(stream.records().where("offset >= 0").select("topic"), write=lambda *_: None)
        assert stream.query is None
