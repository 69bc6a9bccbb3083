"""No silent exits (issue 9): every path where a job could report success while a record is lost,
loop or hang forever, or leak a payload, against real PostgreSQL, Kafka and Spark.

Each test failed on the code before the fix: the comment above it says how.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.integration.spark.counting import Counting, count_keys, counts_table_of, key_of
from tests.kafka_topics import recreate_topic
from txn_offsets import (
    DataLoss,
    RecordRejected,
    RecordsNotConsumed,
    TransactionAborted,
    WriteFailed,
)
from txn_offsets.config import DatabaseSettings
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.writers import PartitionWriter
from txn_offsets.store import offset_rows
from txn_offsets.store.database import engine_for
from txn_offsets.upserts import upsert_add


def _audit(counting: Counting) -> list[tuple[str, int, int | None, int, str]]:
    rows = counting.rows(
        'SELECT topic, part, old_off, new_off, action FROM "{schema}".offset_audit WHERE job = :j ORDER BY id'
    )
    return [(r.topic, r.part, r.old_off, r.new_off, r.action) for r in rows]


# --- 1. a topic deleted and re-created -----------------------------------------------------------
# Before: the planner compared the stored offset with the log start only. A shorter new topic gave
# an empty plan ("caught up") and a longer one was read from the old offset on: records below it
# were skipped without a word.
@pytest.mark.parametrize("second", [60, 600], ids=["shorter", "grown-past"])
def test_recreated_topic_is_data_loss_then_an_audited_skip(
    counting: Counting, kafka_admin: AdminClient, second: int
) -> None:
    topic, first = counting.topic(2, 200)
    counting.run(topic, retries=0)
    assert counting.offsets() == {(topic, 0): 100, (topic, 1): 100}

    recreate_topic(kafka_admin, topic, 2)
    again = counting.produce(topic, second, 2, start=10_000)
    before = (counting.offsets(), counting.totals(), _audit(counting))
    with pytest.raises(DataLoss) as info:
        counting.run(topic, retries=0)
    assert info.value.kind == "recreated"
    assert info.value.stored == 100 and info.value.log_start == 0
    # nothing changed: offsets, results, audit
    assert (counting.offsets(), counting.totals(), _audit(counting)) == before

    summary = counting.run(topic, retries=0, on_data_loss="skip")
    assert summary.records == second
    assert counting.totals() == dict(first + again)
    assert counting.offsets() == counting.ends(topic, 2)
    skips = [row for row in _audit(counting) if row[4] == "data_loss_skip"]
    assert sorted(skips) == [(topic, 0, 100, 0, "data_loss_skip"), (topic, 1, 100, 0, "data_loss_skip")]


# A topic deleted and created again while run_job follows it (on_data_loss="skip"). Before: the
# plan in between got "unknown topic" (TopicMissing, a ConfigError) and the job ended with it,
# although it was told to go on. Now a topic missing mid-run is a transient: planned again after
# the backoff, the new topic id is data loss, skipped and audited, and the job goes on.
def test_a_following_job_outlives_its_topic_deleted_and_created_again(
    counting: Counting, kafka_admin: AdminClient
) -> None:
    topic, first = counting.topic(2, 200)
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def follow() -> None:
        try:
            outcome["summary"] = counting.run(
                topic,
                on_data_loss="skip",
                until_caught_up=False,  # following, until stopped
                retries=3,  # run_job's default: what carries the job over the missing topic
                batch_interval_s=0.2,
                stop=stop,
            )
        except BaseException as exc:  # the test reports it
            outcome["error"] = exc

    def until(done: Any) -> None:
        deadline = time.monotonic() + 120
        while not done() and "error" not in outcome and time.monotonic() < deadline:
            time.sleep(0.2)

    thread = threading.Thread(target=follow, name="follow-recreated", daemon=True)
    thread.start()
    try:
        until(lambda: counting.totals() == dict(first))
        assert counting.totals() == dict(first), outcome
        recreate_topic(kafka_admin, topic, 2, gone_s=2.0)  # ~10 plans at batch_interval_s=0.2
        again = counting.produce(topic, 60, 2, start=10_000)
        until(lambda: counting.totals() == dict(first + again))
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome["summary"].stopped_by == "signal"
    assert counting.totals() == dict(first + again)
    assert counting.offsets() == counting.ends(topic, 2)
    skips = [row for row in _audit(counting) if row[4] == "data_loss_skip"]
    assert sorted(skips) == [(topic, 0, 100, 0, "data_loss_skip"), (topic, 1, 100, 0, "data_loss_skip")]


# A stored offset above the end with no topic id to compare (a row stored before ids were kept, or
# a log truncated under the same id) is data loss too. Before: an empty plan, "caught up".
def test_stored_offset_above_the_end_is_data_loss(counting: Counting, kafka_admin: AdminClient) -> None:
    topic, _ = counting.topic(1, 50)
    counting.run(topic, retries=0)
    with counting.engine.begin() as conn:  # as if stored by a version that did not keep topic ids
        conn.execute(
            sa.text(f'UPDATE "{counting.db.schema}".offsets SET topic_id = NULL WHERE job = :j'),
            {"j": counting.job},
        )
    recreate_topic(kafka_admin, topic, 1)
    counting.produce(topic, 20, 1)
    with pytest.raises(DataLoss) as info:
        counting.run(topic, retries=0)
    assert (info.value.kind, info.value.stored, info.value.log_start) == ("truncated", 50, 20)
    assert counting.offsets() == {(topic, 0): 50}


# --- 2. a lazy aggregate ----------------------------------------------------------------------------
# Before: the records were drained after `aggregate` returned its generator, so `write` saw an
# exhausted generator: the range committed, the offset moved, no result was written.
def test_generator_aggregate_is_materialised_before_the_records_are_drained(counting: Counting) -> None:
    topic, expected = counting.topic(2, 500)
    target = counts_table_of(counting.table)

    def lazy_counts(keys: Iterator[str]) -> Iterator[tuple[str, int]]:
        yield from count_keys(keys).items()

    def write(conn: sa.Connection, rng: OffsetRange, pairs: Any) -> None:
        upsert_add(conn, target, [{"k": k, "n": n} for k, n in pairs], keys=["k"], add=["n"])

    writer = PartitionWriter(write=write, decode=key_of, aggregate=lazy_counts)
    summary = counting.run(topic, writer=writer, retries=0)
    assert summary.records == 500
    assert counting.totals() == dict(expected)


# Before: an aggregate that stopped reading early had the rest drained and committed unseen.
def test_aggregate_that_leaves_records_unread_is_refused(counting: Counting) -> None:
    topic, _ = counting.topic(1, 100)

    def first_three(keys: Iterator[str]) -> collections.Counter[str]:
        return collections.Counter(itertools.islice(keys, 3))

    with pytest.raises(RecordsNotConsumed) as info:
        counting.run(topic, writer=counting.writer(aggregate=first_three), retries=0)
    assert (info.value.topic, info.value.start, info.value.until) == (topic, 0, 100)
    assert counting.offsets() == {(topic, 0): 0}
    assert counting.totals() == {}


# --- 3. a topic that matches a pattern later ---------------------------------------------------------
# Before: a topic found by a later plan was seeded at the start policy ("latest"), so the records
# written to it before that plan were never read.
def test_topic_matching_later_starts_at_its_log_start(counting: Counting) -> None:
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    early, _ = counting.topic(
        1, 10, prefix=prefix
    )  # before the job's first plan: skipped by "latest", as asked
    pattern = f"{prefix}-.*"
    first = counting.run(retries=0, topic_pattern=pattern, start=StartPolicy.latest())
    assert first.records == 0

    late, expected = counting.topic(2, 40, prefix=prefix)
    expected += counting.produce(early, 5, 1, start=500)
    second = counting.run(retries=0, topic_pattern=pattern, start=StartPolicy.latest())
    assert second.records == 45
    assert counting.totals() == dict(expected)
    actions = {(t, p): a for t, p, _old, _new, a in _audit(counting)}
    assert actions == {(early, 0): "seed", (late, 0): "new_topic", (late, 1): "new_topic"}


# --- 4. a write that swallows a database error --------------------------------------------------------
# Before: COMMIT of the aborted transaction silently rolled back, the task reported "committed",
# after_commit fired, and the same batch was planned again forever.
def test_write_swallowing_a_database_error_fails_clearly_and_moves_nothing(
    counting: Counting, tmp_path: Path
) -> None:
    topic, _ = counting.topic(2, 100)
    base = counting.writer()
    fired = tmp_path / "after_commit"

    def swallowing(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        base.write(conn, rng, counts)
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.execute(sa.text("SELECT 1 / 0"))

    def after_commit(rng: OffsetRange, outcome: str) -> None:
        with fired.open("a") as fh:
            fh.write(f"{rng} {outcome}\n")

    writer = PartitionWriter(write=swallowing, decode=key_of, aggregate=count_keys, after_commit=after_commit)
    with pytest.raises(TransactionAborted) as info:
        counting.run(topic, writer=writer, retries=0, max_batches=3)
    assert info.value.job == counting.job and topic in info.value.ranges
    assert not fired.exists()
    assert counting.offsets() == {(topic, 0): 0, (topic, 1): 0}
    assert counting.totals() == {}


# --- 5. dead letters replayed --------------------------------------------------------------------------
# Before: replaying a range with a dead letter (an audited reset) failed on the dead_letters primary
# key in every attempt: the job could never get past it.
def test_dead_letter_mode_survives_a_replay(counting: Counting) -> None:
    topic, _ = counting.topic(1)
    producer = Producer({"bootstrap.servers": counting.kafka.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, key=None, value=f"poison-{i}".encode(), partition=0)
    producer.flush(30)
    expected = counting.produce(topic, 50, 1)

    def strict_key(rec: Record) -> str:
        if rec.key is None:
            raise ValueError("record has no key")
        return rec.key.decode()

    writer = counting.writer(decode=strict_key, dead_letters=True)
    assert counting.run(topic, writer=writer, retries=0).records == 53
    with counting.engine.begin() as conn:
        offset_rows.reset_offsets(
            conn, counting.db, counting.job, {(topic, 0): 0}, reason="replay", actor="test"
        )
    assert counting.run(topic, writer=writer, retries=0).records == 53
    assert counting.totals() == {k: 2 * n for k, n in expected.items()}  # replayed, as asked
    dead = counting.rows('SELECT off FROM "{schema}".dead_letters WHERE job = :j')
    assert sorted(r.off for r in dead) == [0, 1, 2]
    assert counting.offsets() == {(topic, 0): 53}


# --- 6. an executor frozen while it holds a claim ------------------------------------------------------
# Before: nothing on the database side timed out and nothing cancelled the batch: the frozen task held
# its offset row and the batch waited forever while the lease was renewed.
def test_sigstopped_task_holding_a_claim_fails_over(counting: Counting, tmp_path: Path) -> None:
    topic, expected = counting.topic(2, 400)
    base = counting.writer()
    marker = tmp_path / "frozen-pid"

    def freeze_once(conn: sa.Connection, rng: OffsetRange, counts: Any) -> None:
        base.write(conn, rng, counts)
        if rng.partition == 0:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen after the claim, inside the transaction

    db = counting.db
    quick = DatabaseSettings(db.url, schema=db.schema, lock_timeout_s=2, idle_in_transaction_timeout_s=4)
    writer = PartitionWriter(write=freeze_once, decode=key_of, aggregate=count_keys)
    t0 = time.monotonic()
    try:
        summary = counting.run(
            topic, writer=writer, database=quick, batch_timeout_s=15, retries=3, retry_backoff_s=0.5
        )
    finally:
        if marker.exists():  # never leave a stopped process behind, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
    elapsed = time.monotonic() - t0
    assert marker.exists(), "the fault was not injected"
    assert counting.totals() == dict(expected)  # lost=0 duplicated=0
    assert counting.offsets() == counting.ends(topic, 2)
    assert summary.records >= 200
    assert elapsed < 150, f"took {elapsed:.0f}s: the frozen claim was not failed over in time"


# --- 8. payloads never in errors ------------------------------------------------------------------------
PAYLOAD = "top-secret-payload-7f3a"


# Before: the executor engine did not hide bound parameters and the DETAIL line of PostgreSQL's
# error quoted the key: the record's value reached the exception, the log and Spark's task failure.
def test_write_errors_and_rejections_never_show_the_payload(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    topic, _ = counting.topic(1)
    producer = Producer({"bootstrap.servers": counting.kafka.bootstrap_servers})
    producer.produce(topic, key=PAYLOAD.encode(), value=PAYLOAD.encode(), partition=0)
    producer.flush(30)
    table = f'"{counting.db.schema}".uniq'
    with counting.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (k text PRIMARY KEY)"))
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (:k)"), {"k": PAYLOAD})

    def insert_twice(conn: sa.Connection, rng: OffsetRange, keys: list[str]) -> None:
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (:k)"), [{"k": k} for k in keys])

    writer = PartitionWriter(write=insert_twice, decode=key_of, aggregate=list)
    with pytest.raises(WriteFailed) as info:
        counting.run(topic, writer=writer, retries=0)
    assert info.value.sqlstate == "23505" and "uniq_pkey" in str(info.value)
    assert PAYLOAD not in str(info.value) and PAYLOAD not in repr(info.value)

    def picky(rec: Record) -> int:
        return int(rec.value or b"")  # ValueError: invalid literal for int() ... b'top-secret...'

    with pytest.raises(RecordRejected) as rejected:
        counting.run(
            topic,
            writer=PartitionWriter(write=insert_twice, decode=picky),
            job=f"{counting.job}-2",
            retries=0,
        )
    assert "ValueError" in str(rejected.value) and PAYLOAD not in str(rejected.value)
    assert PAYLOAD not in caplog.text


def test_worker_engines_hide_parameters(db: DatabaseSettings) -> None:
    from txn_offsets.store.database import dispose_worker_engines, worker_engine

    eng = worker_engine(db)
    try:
        assert eng.hide_parameters is True
        assert worker_engine(db) is eng  # cached per worker and settings
        with eng.connect() as conn:
            assert conn.execute(sa.text("SHOW lock_timeout")).scalar_one() == "30s"
    finally:
        dispose_worker_engines()
    assert engine_for(db).hide_parameters is True
