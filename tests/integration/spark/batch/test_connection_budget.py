"""The connection budget: a job within its budget is exact and PostgreSQL never shows more of its
connections than the budget (sampled from pg_stat_activity by the run's application_name); a job
whose max_store_connections is below what it needs fails at start, naming the setting, with
nothing changed."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa

from tests.integration.spark.counting import Counting
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.plan.planner import Limits
from txn_offsets.redaction import Secret
from txn_offsets.spark.session import session_cores
from txn_offsets.store.budget import DRIVER_CONNECTIONS, WORKER_CONNECTIONS


def _tagged(db: DatabaseSettings, name: str) -> DatabaseSettings:
    """The same settings, every connection of them named `name` in pg_stat_activity."""
    url = db.url.update_query_dict({"application_name": name})
    return DatabaseSettings(Secret(url.render_as_string(hide_password=False)), schema=db.schema)


def test_a_job_stays_within_its_connection_budget(spark: object, counting: Counting) -> None:
    name = f"budget-{uuid.uuid4().hex[:10]}"
    tagged = _tagged(counting.db, name)
    topic, expected = counting.topic(4, 2_000)
    budget = DRIVER_CONNECTIONS + session_cores(spark) * WORKER_CONNECTIONS
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        with counting.engine.connect() as conn:
            while not done.is_set():
                count = conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"), {"n": name}
                ).scalar_one()
                conn.rollback()
                peak = max(peak, int(count))
                done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        summary = counting.run(
            topic,
            database=tagged,
            limits=Limits(max_records_per_partition=250),
            max_store_connections=budget,
        )
    finally:
        done.set()
        sampler.join(10)
    assert summary.max_connections == budget
    assert counting.totals() == dict(expected)
    assert summary.records == 2_000 and summary.batches >= 2
    assert counting.offsets() == counting.ends(topic, 4)
    assert 1 <= peak <= budget, (peak, budget)


def test_a_job_over_its_budget_fails_at_start(spark: object, counting: Counting) -> None:
    topic, _ = counting.topic(2, 100)
    needed = DRIVER_CONNECTIONS + session_cores(spark) * WORKER_CONNECTIONS
    with pytest.raises(ConfigError) as caught:
        counting.run(topic, max_store_connections=needed - 1)
    message = str(caught.value)
    assert "max_store_connections" in message
    assert f"{needed - 1} is too few" in message and f"raise max_store_connections to {needed}" in message
    assert counting.totals() == {}
    assert counting.offsets() == {}  # no run started, nothing seeded
