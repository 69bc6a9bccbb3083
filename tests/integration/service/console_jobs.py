"""The jobs the console tests look at, made through the protocol a job's driver and tasks use
(start_run, commit_ranges with the Kafka proof and lineage, end_run; a Fenced claim recorded in
the job's stats as the runner records it) and the CLI an operator uses (an audited reset):

* ``done``: ran to completion over a topic of 2 partitions (10 + 6 records), lease released;
* ``running``: a live run that committed 4 of 10 records (lag 6);
* ``fenced``: its run committed, then an operator's ``offsets reset --force`` (with a reason)
  took a new generation, and the run's next claim was fenced (:func:`fence`);
* ``hostile``: a tenant's job whose name holds HTML, and whose reset reason holds HTML, a
  terminal escape and a right-to-left override.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from tests.integration.helpers import produce_counts, seed
from txn_offsets.commit import commit_ranges
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import Fenced
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run, end_run, start_run
from txn_offsets.store.stats import record_failure

REASON = "replay after the bad deploy"
HOSTILE_REASON = "\x1b[31m<script>alert(1)</script><b>bold</b>\u202eevil"


@dataclass
class ConsoleJobs:
    store: Store
    kafka: KafkaSettings
    topic: str
    done: str
    running: str
    fenced: str
    hostile: str
    done_run: Run
    fenced_run: Run

    def fence(self, cli: Callable[..., tuple[int, str, str]]) -> None:
        """The operator resets `fenced` (--force: its run is live) with a reason; the run's next
        claim is Fenced and recorded as the runner records it."""
        code, _out, err = cli(
            "offsets", "reset", "--job", self.fenced, "--topic", self.topic, "--partition", "0",
            "--to-offset", "2", "--reason", REASON, "--force", "--schema", self.store.schema,
        )  # fmt: skip
        assert code == 0, err
        with pytest.raises(Fenced):
            _commit(self.store, self.kafka, self.fenced_run, [OffsetRange(self.topic, 0, 4, 8)], batch=2)
        assert record_failure(self.store, self.fenced, "fenced")


def _commit(store: Store, kafka: KafkaSettings, run: Run, ranges: list[OffsetRange], batch: int) -> None:
    commit_ranges(store, run, ranges, source=kafka, lineage=Lineage(batch=batch))


def make_jobs(
    engine: sa.Engine,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    topic: str,
    cli: Callable[..., tuple[int, str, str]],
) -> ConsoleJobs:
    """The four jobs over `topic` (2 partitions, empty: filled here)."""
    produce_counts(kafka.bootstrap_servers, topic, {0: 10, 1: 6})
    store = Store(engine, db)
    tag = uuid.uuid4().hex[:6]
    done, running, fenced = f"done-{tag}", f"running-{tag}", f"fenced-{tag}"
    hostile = f'<img src=x onerror="alert(1)">&amp;<b>{tag}</b>'
    runs = {job: start_run(store, job, lease_s=600) for job in (done, running, fenced, hostile)}
    for job in runs:
        seed(engine, db, job, {(topic, 0): 0, (topic, 1): 0})
    assert end_run(store, runs[hostile])
    done_run = runs[done]
    _commit(store, kafka, done_run, [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 6)], batch=1)
    assert end_run(store, done_run)
    _commit(store, kafka, runs[running], [OffsetRange(topic, 0, 0, 4)], batch=1)
    fenced_run = runs[fenced]
    _commit(store, kafka, fenced_run, [OffsetRange(topic, 0, 0, 4)], batch=1)
    code, _out, err = cli(
        "offsets", "reset", "--job", hostile, "--topic", topic, "--partition", "1", "--to-offset", "3",
        "--reason", HOSTILE_REASON, "--schema", db.schema,
    )  # fmt: skip
    assert code == 0, err
    return ConsoleJobs(store, kafka, topic, done, running, fenced, hostile, done_run, fenced_run)


def jobs_for(request: pytest.FixtureRequest) -> ConsoleJobs:
    """The four jobs over a new topic, from the test's fixtures (a module's `jobs` fixture)."""
    value = request.getfixturevalue
    topic = value("topic_factory")(partitions=2)
    kafka = KafkaSettings(value("kafka_bootstrap"))
    return make_jobs(value("engine"), value("migrated"), kafka, topic, value("run_cli"))
