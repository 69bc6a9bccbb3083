"""The plans of several jobs made together (plan.planner.plan_jobs, plan.shared.SharedPlans): the
same plans plan_batch makes, in one Kafka request and one statement or transaction (a first plan
seeding its offsets there too); None wherever plan_batch must do more than read or raise; a failure
for all of them leaves each job to plan alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.fix_services import TopicFactory
from tests.integration.helpers import produce_counts
from tests.kafka_topics import delete_topic
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, DataLoss, Fenced, TopicMissing
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, Plan, PlanRequest, TopicSelection, plan_batch, plan_jobs
from txn_offsets.plan.shared import SharedPlans
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, lock_job, renew_leases, start_run
from txn_offsets.store.schema import tables_for

LIMITS = Limits(max_records_per_partition=4)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


@pytest.fixture
def store(migrated: DatabaseSettings) -> Iterator[Store]:
    """The store on a driver engine the jobs share (as run_jobs gives them one)."""
    eng = engine_for(migrated)
    yield Store(eng, migrated)
    eng.dispose()


def _job(
    store: Store,
    kafka: KafkaSettings,
    job: str,
    topic: str,
    limits: Limits = LIMITS,
) -> PlanRequest:
    """A started run of `job` over `topic` that has made its first plan (rows seeded)."""
    run = start_run(store, job)
    request = PlanRequest(run, TopicSelection((topic,)), limits)
    _alone(store, kafka, request)
    return request


def _alone(store: Store, kafka: KafkaSettings, request: PlanRequest) -> Plan:
    return plan_batch(
        store,
        kafka,
        job=request.run.job,
        selection=request.selection,
        start=StartPolicy.earliest(),
        limits=request.limits,
        run=request.run,
    )


def _lease(engine: sa.Engine, db: DatabaseSettings, job: str) -> object:
    with engine.connect() as conn:
        return lock_job(conn, db, job, for_update=False).lease_until


def _at_once(
    plans: SharedPlans,
    store: Store,
    kafka: KafkaSettings,
    requests: list[PlanRequest],
) -> dict[str, Plan | None]:
    """Each request's shared plan, asked by a thread of its own, all released at the same moment."""
    got: dict[str, Plan | None] = {}
    go = threading.Barrier(len(requests))

    def ask(request: PlanRequest) -> None:
        go.wait(30)
        got[request.run.job] = plans.plan(store, kafka, request)

    threads = [threading.Thread(target=ask, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got


def _topics(topic_factory: TopicFactory, kafka: KafkaSettings, n: int, counts: dict[int, int]) -> list[str]:
    topics = [topic_factory(partitions=len(counts)) for _ in range(n)]
    for topic in topics:
        produce_counts(kafka.bootstrap_servers, topic, counts)
    return topics


def test_shared_plans_are_the_plans_each_job_makes_alone_and_renew_every_lease(
    store: Store,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    topics = _topics(topic_factory, kafka, 3, {0: 9, 1: 3})
    limits = [LIMITS, Limits(max_records_per_batch=5), Limits()]
    requests = [
        _job(store, kafka, f"{job_name}-{i}", t, lim)
        for i, (t, lim) in enumerate(zip(topics, limits, strict=True))
    ]
    leases = [_lease(engine, migrated, r.run.job) for r in requests]
    shared = plan_jobs(store, kafka, requests)
    assert all(p is not None for p in shared)
    renewed = [_lease(engine, migrated, r.run.job) for r in requests]
    assert all(after > before for after, before in zip(renewed, leases, strict=True))  # type: ignore[operator]
    alone = [_alone(store, kafka, r) for r in requests]
    assert shared == alone
    assert [sum(r.span for r in p.ranges) for p in alone] == [7, 5, 12]  # 4+3, 5 shared, all 12


def test_a_shared_plan_is_none_where_plan_batch_must_do_more_than_read(
    store: Store,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    """A fenced run, a first plan, a partition without a row, a stored offset past the log's end:
    None for that job only; plan_batch then seeds, or raises what is due."""
    steady, fenced, first, grown, lost = _topics(topic_factory, kafka, 5, {0: 6})
    ok = _job(store, kafka, f"{job_name}-ok", steady)
    zombie = _job(store, kafka, f"{job_name}-fenced", fenced)
    start_run(store, zombie.run.job, force=True)  # a newer run takes the job
    new = PlanRequest(start_run(store, f"{job_name}-first"), TopicSelection((first,)), LIMITS)
    more = _job(store, kafka, f"{job_name}-grown", grown)
    more = PlanRequest(more.run, TopicSelection((grown, steady)), LIMITS)  # a topic with no rows yet
    gone = _job(store, kafka, f"{job_name}-lost", lost)
    offsets = tables_for(migrated.schema).offsets
    with engine.begin() as conn:  # stored past the end: data loss (truncated)
        conn.execute(sa.update(offsets).where(offsets.c.job == gone.run.job).values(off=1_000))
    plans = plan_jobs(store, kafka, [ok, zombie, new, more, gone])
    assert plans[0] is not None and [r.span for r in plans[0].ranges] == [4]
    assert plans[1:] == [None, None, None, None]
    with pytest.raises(Fenced):
        _alone(store, kafka, zombie)
    assert [r.span for r in _alone(store, kafka, new).ranges] == [4]  # seeded at earliest
    assert {r.topic for r in _alone(store, kafka, more).ranges} == {grown, steady}  # seeded
    with pytest.raises(DataLoss):
        _alone(store, kafka, gone)


def test_a_first_plan_seeds_by_its_start_policy_in_the_shared_transaction(
    store: Store,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    """run_jobs' jobs make their first plans together too: each job's offsets are seeded by its own
    start policy (audited, first_plan_at set, as plan_batch seeds them), in a savepoint of its own;
    a first plan that raises (no start policy) is None for that job only and leaves nothing behind."""
    early, late, bare = _topics(topic_factory, kafka, 3, {0: 6, 1: 3})
    requests = [
        PlanRequest(start_run(store, f"{job_name}-{name}"), TopicSelection((t,)), LIMITS, start)
        for name, t, start in (
            ("early", early, StartPolicy.earliest()),
            ("late", late, StartPolicy.latest()),
            ("bare", bare, None),
        )
    ]
    plans = plan_jobs(store, kafka, requests)
    assert plans[2] is None
    first, last = plans[0], plans[1]
    assert first is not None and last is not None
    assert [r.span for r in first.ranges] == [4, 3] and set(first.stored.values()) == {0}
    assert last.ranges == () and dict(last.stored) == {(late, 0): 6, (late, 1): 3}
    # what plan_batch finds afterwards is what the shared plan seeded: the same plans again
    assert [_alone(store, kafka, r) for r in requests[:2]] == [first, last]
    audit = tables_for(migrated.schema).audit
    with engine.connect() as conn:
        for request, seeded in zip(requests, (2, 2, 0), strict=True):
            job = request.run.job
            rows = conn.execute(sa.select(audit.c.action, audit.c.reason).where(audit.c.job == job)).all()
            assert len(rows) == seeded and all(a == "seed" and "first run" in r for a, r in rows), rows
            assert (lock_job(conn, migrated, job, for_update=False).first_plan_at is None) is (seeded == 0)
    bare_request = requests[2]
    with pytest.raises(ConfigError, match="choose where a first run starts"):  # alone: what is missing
        plan_batch(
            store, kafka, job=bare_request.run.job, selection=bare_request.selection,
            start=None, limits=LIMITS, run=bare_request.run,
        )  # fmt: skip


def test_a_failed_shared_plan_leaves_each_job_to_plan_alone(
    store: Store,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    kafka_admin: object,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    """One job's topic deleted: a shared request with it fails for all, so SharedPlans answers None
    to every job of that gathering (asked together or not, a job is never failed by another's
    topic); alone, only that job meets the error."""
    kept, deleted = _topics(topic_factory, kafka, 2, {0: 5})
    good = _job(store, kafka, f"{job_name}-good", kept)
    bad = _job(store, kafka, f"{job_name}-bad", deleted)
    delete_topic(kafka_admin, deleted)  # type: ignore[arg-type]
    with pytest.raises(TopicMissing):
        plan_jobs(store, kafka, [good, bad])
    alone = _alone(store, kafka, good)
    assert [r.span for r in alone.ranges] == [4]
    got = _at_once(SharedPlans(), store, kafka, [good, bad])
    assert got[bad.run.job] is None
    assert got[good.run.job] in (None, alone)  # None when gathered with the bad one
    with pytest.raises(TopicMissing):
        _alone(store, kafka, bad)


def test_plans_asked_at_once_are_made_together(
    store: Store,
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic_factory: TopicFactory,
    job_name: str,
) -> None:
    """Sixteen threads asking at the same moment: each gets its own job's plan (the one plan_batch
    makes), in fewer shared plans than plans."""
    topics = _topics(topic_factory, kafka, 16, {0: 3, 1: 2})
    requests = [_job(store, kafka, f"{job_name}-{i:02d}", t) for i, t in enumerate(topics)]
    plans = SharedPlans()
    got = _at_once(plans, store, kafka, requests)
    assert sorted(got) == sorted(r.run.job for r in requests)
    for request in requests:
        assert got[request.run.job] == _alone(store, kafka, request), request.run.job
    assert plans.plans == len(requests) and 1 <= plans.calls < len(requests)


def test_renew_leases_is_one_run_per_job(store: Store, migrated: DatabaseSettings, run: Run) -> None:
    with store.begin() as conn, pytest.raises(ConfigError, match="one run per job"):
        renew_leases(conn, migrated, [run, run])
    with store.begin() as conn:
        assert renew_leases(conn, migrated, []) == {}
        assert list(renew_leases(conn, migrated, [run])) == [run.job]
