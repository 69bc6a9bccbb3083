"""Runs: generation, lease, heartbeat, fencing, and why a claim can never overtake a new run."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets import ConfigError, Fenced, JobAlreadyRunning
from txn_offsets.commit import Outcome
from txn_offsets.commit.claim import claim_ranges
from txn_offsets.commit.classify import ClaimResult
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.lease import LeaseKeeper
from txn_offsets.store.runs import Run, end_run, heartbeat, lock_job, start_run


def _state(engine: sa.Engine, db: DatabaseSettings, job: str) -> tuple[int, str | None, bool]:
    with engine.connect() as conn:
        s = lock_job(conn, db, job, for_update=False)
    return s.generation, s.run_id, s.live


def test_start_run_bumps_generation_and_takes_the_lease(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    first = start_run(Store(engine, migrated), job_name)
    assert first.generation == 1
    assert _state(engine, migrated, job_name) == (1, first.run_id, True)


def test_second_live_run_is_refused_naming_the_live_run(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    with pytest.raises(JobAlreadyRunning) as info:
        start_run(Store(engine, migrated), run.job)
    assert info.value.run_id == run.run_id
    assert run.run_id in str(info.value) and "--force" in str(info.value)
    assert _state(engine, migrated, run.job) == (run.generation, run.run_id, True)  # unchanged


def test_force_fences_the_live_run(engine: sa.Engine, migrated: DatabaseSettings, run: Run) -> None:
    newer = start_run(Store(engine, migrated), run.job, force=True)
    assert newer.generation == run.generation + 1
    with pytest.raises(Fenced):
        heartbeat(Store(engine, migrated), run)
    assert end_run(Store(engine, migrated), run) is False  # a fenced run cannot release the new lease
    assert _state(engine, migrated, run.job) == (newer.generation, newer.run_id, True)


def test_expired_lease_lets_a_new_run_start(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    old = start_run(Store(engine, migrated), job_name, lease_s=0.2)
    time.sleep(0.3)
    new = start_run(Store(engine, migrated), job_name)
    assert new.generation == old.generation + 1


def test_heartbeat_extends_and_end_releases(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    run = start_run(Store(engine, migrated), job_name, lease_s=0.5)
    for _ in range(3):
        time.sleep(0.25)
        heartbeat(Store(engine, migrated), run)
    assert _state(engine, migrated, job_name)[2] is True  # 0.75 s later, still live thanks to heartbeats
    assert end_run(Store(engine, migrated), run) is True
    assert _state(engine, migrated, job_name) == (run.generation, None, False)
    assert start_run(Store(engine, migrated), job_name).generation == run.generation + 1


@pytest.mark.parametrize("job", ["", "   ", "x" * 201, "bad\nname"])
def test_bad_job_names(engine: sa.Engine, migrated: DatabaseSettings, job: str) -> None:
    with pytest.raises(ConfigError, match="job"):
        start_run(Store(engine, migrated), job)


def test_bad_lease(engine: sa.Engine, migrated: DatabaseSettings, job_name: str) -> None:
    with pytest.raises(ConfigError, match="lease_s"):
        start_run(Store(engine, migrated), job_name, lease_s=0)


def test_new_run_waits_for_a_claim_in_flight_then_fences_later_claims(
    engine: sa.Engine, migrated: DatabaseSettings, store: Store, run: Run, aggregate: Aggregate
) -> None:
    """A batch already claiming when a new run starts finishes first; the new run never sees a
    half state, and the old run's next batch is fenced."""
    seed(engine, migrated, run.job, {("t", 0): 0})
    claimed, release = threading.Event(), threading.Event()
    out: dict[str, object] = {}

    def slow_write(conn: sa.Connection) -> None:
        aggregate.write(conn)
        claimed.set()
        assert release.wait(30)

    def old_batch() -> None:
        out["old"] = commit_ranges(store, run, [OffsetRange("t", 0, 0, 5)], slow_write)[0].outcome

    def new_run() -> None:
        out["new"] = start_run(store, run.job, force=True)

    t1 = threading.Thread(target=old_batch)
    t1.start()
    assert claimed.wait(30)
    t2 = threading.Thread(target=new_run)
    t2.start()
    t2.join(timeout=0.5)
    assert t2.is_alive(), "start_run did not wait for the claim in flight"
    release.set()
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert out["old"] is Outcome.COMMITTED
    newer = out["new"]
    assert isinstance(newer, Run) and newer.generation == run.generation + 1
    with pytest.raises(Fenced):
        commit_ranges(store, run, [OffsetRange("t", 0, 5, 9)], aggregate.write)
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 5}
    assert aggregate.value() == 1


def test_start_gives_up_on_a_stuck_claim_with_a_clear_error(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    # hold the claim's lock as a batch stuck before COMMIT would
    with engine.connect() as stuck, stuck.begin():
        assert (
            claim_ranges(stuck, migrated, run, [OffsetRange("t", 0, 0, 1)], record=False)[0]
            is ClaimResult.CLAIMED
        )
        with pytest.raises(JobAlreadyRunning) as info:
            start_run(Store(engine, migrated), run.job, force=True, lock_timeout_s=0.3)
        assert info.value.run_id == run.run_id
        stuck.rollback()
    assert _state(engine, migrated, run.job)[0] == run.generation  # nothing changed


def _heartbeat_at(engine: sa.Engine, db: DatabaseSettings, job: str) -> object:
    with engine.connect() as conn:
        return lock_job(conn, db, job, for_update=False).heartbeat_at


def test_lease_keeper_renews_only_while_armed_and_never_past_the_batch_timeout(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    run = start_run(Store(engine, migrated), job_name, lease_s=0.6)
    keeper = LeaseKeeper(Store(engine, migrated), run, every_s=0.1)
    try:
        with keeper.during(None):
            time.sleep(1.0)  # longer than the lease: only the keeper's renewals keep it live
            assert _state(engine, migrated, job_name)[2] is True
        idle = _heartbeat_at(engine, migrated, job_name)
        time.sleep(0.4)
        assert _heartbeat_at(engine, migrated, job_name) == idle  # disarmed between batches
        with keeper.during(0.3):  # a batch past its timeout stops holding the job
            time.sleep(1.2)
            assert _state(engine, migrated, job_name)[2] is False
        # the same thread serves the next batch
        with keeper.during(None):
            time.sleep(0.35)
            assert _state(engine, migrated, job_name)[2] is True
    finally:
        keeper.close()
    with pytest.raises(RuntimeError, match="closed"), keeper.during(None):
        pass


def test_plan_renews_the_lease_in_its_transaction_and_is_fenced_by_a_newer_run(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str, kafka_bootstrap: str
) -> None:
    kafka_settings = KafkaSettings(kafka_bootstrap)
    run = start_run(Store(engine, migrated), job_name, lease_s=0.5)
    selection = TopicSelection((), r"^txn-offsets-no-such-topic-\d+$")
    plan = functools.partial(
        plan_batch,
        Store(engine, migrated),
        kafka_settings,
        job=job_name,
        selection=selection,
        start=None,
        limits=Limits(),
    )
    time.sleep(0.7)  # the lease expired
    assert _state(engine, migrated, job_name)[2] is False
    assert plan(run=run).ranges == ()
    assert _state(engine, migrated, job_name)[2] is True  # the plan renewed it
    newer = start_run(Store(engine, migrated), job_name, force=True)
    with pytest.raises(Fenced) as info:
        plan(run=run)
    assert info.value.current == newer.generation
    assert _state(engine, migrated, job_name)[1] == newer.run_id  # the fenced plan changed nothing
    with pytest.raises(ConfigError, match="run"):
        plan(run=newer, generation=run.generation)
