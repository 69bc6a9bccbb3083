"""A job catching up plans its next batch from the last one's plan (no round trip: runner's
REPLAN_EVERY_S, planner.plan_next), and the claims' guard holds those batches as it holds any: the
job is exact, and a newer run fences the old one's carried batch before it writes anything."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.spark.counting import Counting
from txn_offsets.errors import Fenced
from txn_offsets.plan.planner import Limits, plan_next
from txn_offsets.spark import runner
from txn_offsets.spark.many import run_jobs
from txn_offsets.spark.summary import BatchReport
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


@pytest.fixture
def fresh_plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fresh plans of the runner (its own or a joint one), one entry each; carried plans make
    none. REPLAN_EVERY_S is made long, so that a slow machine does not make the count vary."""
    made: list[int] = []
    fresh_plan = runner._fresh_plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return fresh_plan(*args, **kwargs)

    monkeypatch.setattr(runner, "_fresh_plan", counted)
    monkeypatch.setattr(runner, "REPLAN_EVERY_S", 3600.0)
    return made


def test_a_job_catching_up_plans_from_its_last_batch_and_stays_exact(
    counting: Counting, fresh_plans: list[int]
) -> None:
    topic, expected = counting.topic(4, 10_000)
    summary = counting.run(topic, limits=Limits(max_records_per_batch=1_000))
    assert summary.batches == 10 and summary.records == 10_000
    # the first plan, then nine carried ones while each filled its batch; the last (fresh) found
    # nothing more to read
    assert len(fresh_plans) == 2
    assert counting.totals() == dict(expected)
    assert counting.offsets() == counting.ends(topic, 4)


def test_a_partition_writer_plans_its_next_batch_while_its_spark_job_runs(
    counting: Counting, fresh_plans: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each carried plan is worked out on the run's plan-next thread, started with the batch it
    follows (runner._PlanAhead), not on the driver's thread after the batch's Spark job; the job
    is exact and plans as often as before."""
    threads: list[str] = []

    def recorded(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return plan_next(*args)

    monkeypatch.setattr(runner, "plan_next", recorded)
    topic, expected = counting.topic(4, 6_000)
    summary = counting.run(topic, limits=Limits(max_records_per_batch=1_000))
    assert summary.batches == 6 and summary.records == 6_000
    # one plan_next after each batch (the last one's None: not a full batch), each on that thread
    assert len(threads) == 6
    assert all(name.startswith("txn-offsets-plan-next") for name in threads), threads
    assert len(fresh_plans) == 2
    assert counting.totals() == dict(expected)
    assert counting.offsets() == counting.ends(topic, 4)


def test_a_carried_batch_of_a_fenced_run_writes_nothing(counting: Counting, fresh_plans: list[int]) -> None:
    topic, _ = counting.topic(2, 4_000)
    eng = engine_for(counting.db)
    newer: list[int] = []

    def deploy_a_newer_run(report: BatchReport) -> None:  # after the first batch committed
        if not newer:
            newer.append(start_run(Store(eng, counting.db), counting.job, force=True).generation)

    on_batch: Callable[[BatchReport], None] = deploy_a_newer_run
    with pytest.raises(Fenced) as fenced:
        counting.run(
            topic,
            limits=Limits(max_records_per_batch=1_000),
            on_batch=on_batch,
        )
    eng.dispose()
    assert len(fresh_plans) == 1  # the second batch was carried: its claims met the fence
    assert fenced.value.current == newer[0]
    assert sum(counting.totals().values()) == 1_000  # the first batch, once
    assert sum(counting.offsets().values()) == 1_000


def test_jobs_in_shared_rounds_carry_their_plans_and_stay_exact(
    spark: Any, counting: Counting, fresh_plans: list[int]
) -> None:
    """Under run_jobs a job whose last batch was full plans the next from it, without the round's
    shared planner; its batches still share the rounds' Spark jobs and commits."""
    topics, expected = counting.topics(3, 2, 3_000, keys=31)
    tables = counting.tables(3, name="carried")
    limits = Limits(max_records_per_batch=500)
    jobs = {
        f"{counting.job}-{i}": counting.job_options(tables[i], topics[i], limits=limits) for i in range(3)
    }
    result = run_jobs(spark, jobs)
    result.raise_for_errors()
    assert [result.summaries[name].batches for name in jobs] == [6, 6, 6]
    assert len(fresh_plans) == 6  # per job: its first plan, five carried, a last fresh one
    assert result.round_batches == 18
    for i, name in enumerate(jobs):
        counting.assert_exact(topics[i], 2, expected[i], table=tables[i], job=name)
