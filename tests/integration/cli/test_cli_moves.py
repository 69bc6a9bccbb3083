"""What `offsets reset` and `offsets import` say about a move, end to end through the CLI against
real PostgreSQL and Kafka: a forced reset's note says it fences the live run (not that it needs
--force); a shift past the offsets' range is clamped to the log, and refused as a usage error with
--allow-outside-log (never shown as a plan); an import of exactly the offsets stored is a no-op
that says so (exit 0, no --force, no audit row, no new generation, no run fenced)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, produce_counts, seed
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, lock_job, start_run
from txn_offsets.store.schema import tables_for

MAX = 2**63 - 1


def _audit_rows(engine: sa.Engine, db: DatabaseSettings, job: str) -> int:
    a = tables_for(db.schema).audit
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(a.c.job == job)).scalar_one())


@pytest.fixture
def live_job(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> Callable[[int, int], tuple[str, Run]]:
    """make(records, stored): a topic of one partition holding `records` records, and a live run
    of the job with its offset there stored at `stored`; returns (topic, run)."""

    def make(records: int, stored: int) -> tuple[str, Run]:
        topic = topic_factory(partitions=1)
        produce_counts(kafka_bootstrap, topic, {0: records})
        live = start_run(Store(engine, migrated), job_name)
        seed(engine, migrated, job_name, {(topic, 0): stored})
        return topic, live

    return make


def test_a_forced_reset_says_it_fences_the_live_run(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    live_job: Callable[[int, int], tuple[str, Run]],
) -> None:
    topic, live = live_job(10, 10)
    reset = [
        "offsets",
        "reset",
        "--job",
        live.job,
        "--to-offset",
        "4",
        "--schema",
        migrated.schema,
        "--force",
    ]
    code, out, err = run_cli(*reset, "--dry-run")
    assert code == 0, err
    assert f"note: live run {live.run_id} holds the lease" in out
    assert "--force: the reset would fence it" in out and "need --force" not in out
    code, out, err = run_cli(*reset, "--reason", "replay")
    assert code == 0, err
    assert "--force: the reset fences it" in out and "needs --force" not in out
    assert offsets_of(engine, migrated, live.job) == {(topic, 0): 4}


def test_a_reset_refused_by_a_live_run_says_when_its_lease_expires(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    live_job: Callable[[int, int], tuple[str, Run]],
) -> None:
    """Without --force the move is refused in one line that says when the holder's lease expires
    (start_run's default lease: 60 s) and what sets it, as a refused run_job start does."""
    topic, live = live_job(10, 10)
    reset = ["offsets", "reset", "--job", live.job, "--to-offset", "4", "--schema", migrated.schema]
    code, out, err = run_cli(*reset, "--dry-run")
    assert code == 0, err
    assert re.search(r"holds the lease \(heartbeat \d+\.\ds ago, expires in \d+\.\ds\)", out), out
    code, out, err = run_cli(*reset, "--reason", "replay")
    assert code != 0 and err.count("\n") == 1, err
    assert f"held by live run {live.run_id}" in err
    assert re.search(r"its lease expires in \d+\.\ds unless renewed \(lease_s=60, ", err), err
    assert offsets_of(engine, migrated, live.job) == {(topic, 0): 10}


def test_a_shift_past_the_range_is_clamped_or_refused_never_planned(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    live_job: Callable[[int, int], tuple[str, Run]],
) -> None:
    topic, live = live_job(5, 2)
    job_name = live.job
    shift = ["offsets", "reset", "--job", job_name, "--topic", topic, "--shift-by", str(MAX)]
    shift += ["--schema", migrated.schema, "--force"]
    # inside the log: clamped to its end, as kafka-consumer-groups.sh does
    code, out, err = run_cli(*shift, "--dry-run")
    assert code == 0, err
    assert f"{topic}[0]  2 -> 5  (+3)" in out and "clamped to 5" in out
    # outside it: 2 + MAX is no offset; refused before any plan is printed, dry run or not
    for extra in (["--dry-run"], ["--reason", "r"]):
        code, out, err = run_cli(*shift, "--allow-outside-log", *extra)
        assert (code, out) == (64, ""), err
        assert f"argument --shift-by: {topic}[0] at 2 would move to {2 + MAX}; offsets are 0..{MAX}" in err
        assert err.count("\n") == 1
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 2}


def test_importing_the_offsets_stored_is_a_no_op_that_says_so(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 10})
    group = f"legacy-{uuid.uuid4().hex[:8]}"
    mirror = GroupMirror(KafkaSettings(kafka_bootstrap), group)
    assert mirror.commit({(topic, 0): 7, (topic, 1): 3})
    cmd = ["offsets", "import", "--job", job_name, "--from-consumer-group", group]
    cmd += ["--schema", migrated.schema, "--reason", "move"]
    code, _, err = run_cli(*cmd)
    assert code == 0, err
    live = start_run(Store(engine, migrated), job_name)  # a live run: a no-op needs no --force
    audited = _audit_rows(engine, migrated, job_name)

    for extra in ([], ["--dry-run"]):
        code, out, err = run_cli(*cmd, *extra)
        assert code == 0 and "error" not in err, err  # stderr: the progress lines
        assert f"{topic}[0]  7 -> 7  (+0)" in out
        assert out.splitlines()[-1] == (
            f"job {job_name!r} already has exactly these offsets, of the same topic incarnation(s): "
            "nothing to import, nothing changed"
        )
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 7, (topic, 1): 3}
    assert _audit_rows(engine, migrated, job_name) == audited
    with engine.connect() as conn:
        state = lock_job(conn, migrated, job_name, for_update=False)
    assert (state.generation, state.run_id, state.live) == (live.generation, live.run_id, True)

    # one offset differs: a change again, refused without --force as before
    assert mirror.commit({(topic, 1): 4})
    code, out, err = run_cli(*cmd)
    assert code == 1 and live.run_id in err and "--force" in err, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 7, (topic, 1): 3}
