"""A fenced run says what fenced it - a newer run, an offsets reset, an import, a retire - and what
it had committed (issue 44, item 3): a real job, fenced by the real thing through the CLI's entry
point, after 4 committed batches. Before, every fence said "a newer run of this job started ...
nothing of it was written", whatever fenced it and whatever the run had committed."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fix_services import REPO
from tests.integration.spark.counting import Counting, key_of
from txn_offsets.errors import Fenced
from txn_offsets.kafka.records import Record
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.summary import BatchReport
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.store.audit import default_actor
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

CLI = REPO / ".venv" / "bin" / "txn-offsets"
PER_BATCH = 100  # records per partition and batch: 500 per partition are 5 batches


def _cli(counting: Counting, database_url: str, *argv: str) -> None:
    """`txn-offsets ARGV` on the job's schema, as an operator runs it; it succeeded."""
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_SCHEMA": counting.db.schema,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": counting.kafka.bootstrap_servers,
    }
    done = subprocess.run(
        [str(CLI), *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _fenced_after_four_batches(counting: Counting, fence: Any, **options: Any) -> tuple[Fenced, str]:
    """Run the job over a new topic of 2 x 500 records, `fence()` once its 4th batch committed;
    the Fenced it ends with, and the topic."""
    topic, _ = counting.topic(2, 1_000)

    def on_batch(report: BatchReport) -> None:
        if report.number == 4:
            fence()

    with pytest.raises(Fenced) as info:
        counting.run(topic, limits=Limits(max_records_per_partition=PER_BATCH), on_batch=on_batch, **options)
    return info.value, topic


def _four_batches(err: Fenced, topic: str) -> str:
    assert err.committed is not None
    assert (err.committed.batches, err.committed.ranges, err.committed.in_flight) == (4, 8, 0)
    assert err.committed.through == ((topic, 0, 400), (topic, 1, 400))
    return (
        f"Before it, this run ({err.committed.run_id}) committed 4 batches (8 range(s), through "
        f"{topic}[0]@400, {topic}[1]@400): those stay committed, counted once; nothing after them was "
        f"written. This run stops; the next run starts from the stored offsets."
    )


def _runs(counting: Counting) -> set[str]:
    return {r[0] for r in counting.rows('SELECT DISTINCT run_id FROM "{schema}".commits WHERE job = :j')}


def test_a_reset_is_named_with_who_and_why(counting: Counting, database_url: str) -> None:
    reset = (
        "offsets",
        "reset",
        "--job",
        counting.job,
        "--to-earliest",
        "--reason",
        "replay Tuesday",
        "--force",
    )
    err, topic = _fenced_after_four_batches(counting, lambda: _cli(counting, database_url, *reset))
    assert err.by is not None and err.by.reason is not None
    assert (err.by.cause, err.by.generation, err.by.who) == ("reset", 2, default_actor())
    assert err.by.reason.startswith("replay Tuesday") and err.by.at is not None
    assert str(err).startswith(
        f"run generation 1 of job {counting.job!r} was fenced by an offsets reset (generation 2) by "
        f"{default_actor()} at {err.by.at.isoformat(sep=' ', timespec='seconds')}, reason 'replay Tuesday"
    )
    assert str(err).endswith(_four_batches(err, topic))
    assert err.committed is not None and _runs(counting) == {err.committed.run_id}
    assert "a newer run" not in str(err) and "nothing of it was written" not in str(err)


def test_an_import_is_named(counting: Counting, database_url: str) -> None:
    legacy = f'"{counting.db.schema}".legacy'
    with counting.engine.begin() as conn:
        conn.execute(
            sa.text(f'CREATE TABLE {legacy} (app text, topic text, "partition" int, "offset" bigint)')
        )
    made: dict[str, str] = {}

    def fence() -> None:
        topic = next(iter(counting.offsets()))[0]
        with counting.engine.begin() as conn:
            conn.execute(
                sa.text(f"INSERT INTO {legacy} VALUES ('a', :t, 0, 0), ('a', :t, 1, 0)"), {"t": topic}
            )
        made["topic"] = topic
        source = f"{counting.db.schema}.legacy"
        _cli(
            counting,
            database_url,
            *("offsets", "import", "--job", counting.job, "--from-table", source, "--table-filter", "app=a"),
            *("--current-topic-incarnation", "--reason", "back to the legacy table", "--force"),
        )

    err, topic = _fenced_after_four_batches(counting, fence)
    assert err.by is not None and (err.by.cause, err.by.generation, err.by.who) == (
        "import",
        2,
        default_actor(),
    )
    assert f"was fenced by an offsets import (generation 2) by {default_actor()} at " in str(err)
    assert str(err).endswith(_four_batches(err, topic))


def test_a_retire_is_named(counting: Counting, database_url: str) -> None:
    retire = ("jobs", "retire", "--job", counting.job, "--reason", "moved to job B", "--force")
    err, topic = _fenced_after_four_batches(counting, lambda: _cli(counting, database_url, *retire))
    assert err.by is not None and (err.by.cause, err.by.who, err.by.reason) == (
        "retire",
        default_actor(),
        "moved to job B",
    )
    assert f"was fenced by jobs retire (generation 2) by {default_actor()} at " in str(err)
    assert ", reason 'moved to job B'. Before it," in str(err)
    assert str(err).endswith(_four_batches(err, topic))


def test_a_newer_run_is_named_with_its_run_id(counting: Counting) -> None:
    newer: list[str] = []

    def fence() -> None:  # a new deployment of the job, started with force=True
        newer.append(start_run(Store(counting.engine, counting.db), counting.job, force=True).run_id)

    err, topic = _fenced_after_four_batches(counting, fence)
    assert err.by is not None
    assert (err.by.cause, err.by.generation, err.by.who) == ("run", 2, newer[0])
    assert f"was fenced by a newer run of this job (generation 2, run {newer[0]}, started at " in str(err)
    assert str(err).endswith(_four_batches(err, topic))


def test_a_batch_in_flight_that_committed_in_part_is_said(
    counting: Counting, database_url: str, tmp_path: Path
) -> None:
    """Batch 5's range of partition 0 commits; its range of partition 1 waits (before its claim)
    until a reset fenced the run: the message counts the committed range of batch 5 and says the
    rest of it was not written."""
    topic, _ = counting.topic(2, 1_000)
    held, release = tmp_path / "held", tmp_path / "release"

    def decode(record: Record) -> str:
        if (record.partition, record.offset) == (1, 4 * PER_BATCH):  # batch 5's range of partition 1
            held.touch()
            deadline = time.monotonic() + 120
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return key_of(record)

    def fence() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = counting.rows('SELECT part FROM "{schema}".commits WHERE job = :j AND batch = 5')
            if held.exists() and [r[0] for r in rows] == [0]:
                break
            time.sleep(0.1)
        reset = ("offsets", "reset", "--job", counting.job, "--to-earliest", "--reason", "replay", "--force")
        _cli(counting, database_url, *reset)
        release.touch()

    fencer = threading.Thread(target=fence)

    def on_batch(report: BatchReport) -> None:
        if report.number == 4:
            fencer.start()

    with pytest.raises(Fenced) as info:
        counting.run(
            topic,
            writer=counting.writer(decode=decode),
            limits=Limits(max_records_per_partition=PER_BATCH),
            read=ReadOptions(max_tasks=1, ranges_per_transaction=1),  # partition 0, then 1, one task
            on_batch=on_batch,
        )
    fencer.join(timeout=60)
    err = info.value
    assert err.by is not None and err.by.cause == "reset"
    assert err.committed is not None
    assert (err.committed.batches, err.committed.ranges, err.committed.in_flight) == (4, 9, 1)
    assert err.committed.through == ((topic, 0, 500), (topic, 1, 400))
    assert (
        f"committed 4 batches and 1 range(s) of batch 5, which was in flight (9 range(s), through "
        f"{topic}[0]@500, {topic}[1]@400): those stay committed, counted once; the rest of batch 5 was "
        f"not written."
    ) in str(err)
