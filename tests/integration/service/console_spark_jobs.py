"""Real txn_offsets jobs for the console's browser test, run the README's way: a Kafka topic, the
test session's local PySpark session (:mod:`tests.fix_spark`, shared) and the public API
(:func:`txn_offsets.run_job` with a :class:`~txn_offsets.BatchWriter` writing a table), and the CLI
an operator uses (an audited reset):

* ``done``: ran until caught up over a topic of 2 partitions (10 + 6 records), lease released;
* ``held``: a run paused inside its first batch (its ``compute_df`` waits on a gate, before any
  claim: no transaction open), so it holds its lease - a running job - until :meth:`release`;
* ``fenced``: paused the same way, until :meth:`fence`: an operator's ``offsets reset --force``
  (with a reason) takes a new generation while the batch is in flight, the gate opens, and the
  batch's claim is Fenced - what ``run_job`` raises;
* ``failing``: its write raises an error whose message holds record data (``PAYLOAD``): the run
  fails with WriteFailed;
* ``hostile``: a tenant's job whose name holds HTML, run to the end, then reset with a reason that
  holds HTML, a terminal escape and a right-to-left override.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from tests.integration.helpers import produce_counts
from tests.integration.service.console_jobs import HOSTILE_REASON, REASON
from txn_offsets import (
    BatchWriter,
    DatabaseSettings,
    Fenced,
    JobSummary,
    KafkaSettings,
    OffsetRange,
    run_job,
)
from txn_offsets.kafka.start import StartPolicy

_WAIT_S = 120.0  # a loaded machine's Spark (the test passes in tens of seconds)
PAYLOAD = "card=4111-1111-1111-1111"  # in the failing job's error: never stored, never shown


class _Job:
    """A job run in a thread; `paused`: its batches wait at a gate before computing (no claim yet)."""

    def __init__(self, start: Callable[[BatchWriter[int]], JobSummary], write: Any, *, paused: bool) -> None:
        self.reached, self.gate = threading.Event(), threading.Event()
        if not paused:
            self.gate.set()
        self.summary: JobSummary | None = None
        self.error: BaseException | None = None

        def compute(records: Any) -> int:
            self.reached.set()
            self.gate.wait(_WAIT_S)
            return int(records.count())

        def main() -> None:
            try:
                self.summary = start(BatchWriter(write=write, compute_df=compute))
            except BaseException as exc:  # the test reads it
                self.error = exc

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()

    def pausing(self) -> None:
        assert self.reached.wait(_WAIT_S), "the paused job never reached its first batch"

    def finish(self) -> None:
        self.gate.set()
        self.thread.join(_WAIT_S)
        assert not self.thread.is_alive(), "the job did not end"


@dataclass
class SparkConsoleJobs:
    engine: sa.Engine
    db: DatabaseSettings
    kafka: KafkaSettings
    topic: str
    done: str
    held: str
    fenced: str
    hostile: str
    failing: str
    done_summary: JobSummary
    _paused: dict[str, _Job] = field(default_factory=dict)

    def fence(self, cli: Callable[..., tuple[int, str, str]]) -> None:
        """The operator resets `fenced` (--force: its run is live) with a reason; its batch goes
        on, and its claim is Fenced."""
        code, _out, err = cli(
            "offsets", "reset", "--job", self.fenced, "--topic", self.topic, "--partition", "0",
            "--to-offset", "2", "--reason", REASON, "--force", "--schema", self.db.schema,
        )  # fmt: skip
        assert code == 0, err
        paused = self._paused[self.fenced]
        paused.finish()
        assert isinstance(paused.error, Fenced), paused.error

    def release(self) -> JobSummary:
        """The held job's batch goes on; it runs until caught up and ends."""
        paused = self._paused[self.held]
        paused.finish()
        assert paused.error is None and paused.summary is not None, paused.error
        return paused.summary

    def stop(self) -> None:
        """Every paused job let go (a failed test leaves no thread waiting)."""
        for paused in self._paused.values():
            paused.gate.set()
            paused.thread.join(_WAIT_S)

    def committed(self, job: str, partition: int, offset: int) -> sa.Row[Any]:
        """The lineage row of `job` whose range holds `offset` of `partition` (read here, in SQL)."""
        c = sa.table("commits", *(sa.column(n) for n in _LINEAGE), schema=self.db.schema)
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(*(c.c[n] for n in _LINEAGE)).where(
                    c.c.job == job,
                    c.c.topic == self.topic,
                    c.c.part == partition,
                    c.c.from_off <= offset,
                    c.c.until_off > offset,
                )
            ).one()


_LINEAGE = ("job", "topic", "part", "from_off", "until_off", "generation", "run_id", "committed_at")


def make_spark_jobs(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic: str,
    cli: Callable[..., tuple[int, str, str]],
) -> SparkConsoleJobs:
    """The four jobs over `topic` (2 partitions, empty: filled here); `held` and `fenced` paused."""
    produce_counts(kafka.bootstrap_servers, topic, {0: 10, 1: 6})
    table = f'"{db.schema}".console_batches'
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"CREATE TABLE IF NOT EXISTS {table} (job text NOT NULL, records bigint NOT NULL)")
        )

    def writer_of(job: str) -> Callable[[sa.Connection, Sequence[OffsetRange], int], None]:
        def write(conn: sa.Connection, _ranges: Sequence[OffsetRange], records: int) -> None:
            conn.execute(sa.text(f"INSERT INTO {table} VALUES (:job, :n)"), {"job": job, "n": records})

        return write

    def start(job: str) -> Callable[[BatchWriter[int]], JobSummary]:
        def go(writer: BatchWriter[int]) -> JobSummary:
            return run_job(
                spark, job=job, kafka=kafka, database=db, writer=writer, topics=[topic],
                start=StartPolicy.earliest(), until_caught_up=True, batch_interval_s=0.2, retries=0,
            )  # fmt: skip

        return go

    def refuse(_conn: sa.Connection, _ranges: Sequence[OffsetRange], _records: int) -> None:
        raise RuntimeError(PAYLOAD)  # a user's error whose message holds record data

    tag = uuid.uuid4().hex[:6]
    done, held, fenced, failing = f"done-{tag}", f"held-{tag}", f"fenced-{tag}", f"failing-{tag}"
    hostile = f'<img src=x onerror="alert(1)">&amp;<b>{tag}</b>'
    # the three that end at once on the shared session; then the two that pause (each waits at
    # its gate on the driver, holding no core)
    runs = {job: _Job(start(job), writer_of(job), paused=False) for job in (done, hostile)}
    runs[failing] = _Job(start(failing), refuse, paused=False)
    try:
        for job in (done, hostile, failing):
            runs[job].finish()
        for job in (held, fenced):
            runs[job] = _Job(start(job), writer_of(job), paused=True)
            runs[job].pausing()
    except BaseException:
        for run in runs.values():
            run.gate.set()
        raise
    for job in (done, hostile):
        assert runs[job].error is None and runs[job].summary is not None, runs[job].error
    assert runs[failing].error is not None, "the failing job did not fail"
    with engine.connect() as conn:
        written = conn.execute(sa.text(f"SELECT sum(records) FROM {table} WHERE job = :job"), {"job": done})
        assert written.scalar_one() == 16, "the done job did not count the 16 records once"
    code, _out, err = cli(
        "offsets", "reset", "--job", hostile, "--topic", topic, "--partition", "1", "--to-offset", "3",
        "--reason", HOSTILE_REASON, "--schema", db.schema,
    )  # fmt: skip
    assert code == 0, err
    done_summary = runs[done].summary
    assert done_summary is not None
    jobs = SparkConsoleJobs(engine, db, kafka, topic, done, held, fenced, hostile, failing, done_summary)
    jobs._paused.update({job: runs[job] for job in (held, fenced)})
    return jobs
