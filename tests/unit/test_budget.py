"""The connection budget's arithmetic and its errors (store.budget): no database needed."""

from __future__ import annotations

import pytest

from txn_offsets.errors import ConfigError
from txn_offsets.store.budget import DRIVER_CONNECTIONS, WORKER_CONNECTIONS, plan_budget
from txn_offsets.store.database import DRIVER_POOL, WORKER_POOL
from txn_offsets.store.health import ConnectionHeadroom


def test_a_run_needs_the_driver_pool_plus_a_worker_pool_per_slot() -> None:
    assert (DRIVER_CONNECTIONS, WORKER_CONNECTIONS) == (sum(DRIVER_POOL), sum(WORKER_POOL)) == (5, 2)
    plan = plan_budget(16, None)
    assert (plan.slots, plan.needed, plan.budget) == (16, 5 + 16 * 2, 37)
    assert plan_budget(16, 100).budget == 100  # the stated number, when stated


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "10"])
def test_a_bad_setting_is_named(limit: object) -> None:
    with pytest.raises(ConfigError, match="max_store_connections"):
        plan_budget(2, limit)  # type: ignore[arg-type]


def test_a_budget_below_the_need_names_the_setting_and_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        plan_budget(8, 20)
    assert str(caught.value).startswith("max_store_connections: 20 is too few for this job")
    assert "up to 21 connections" in str(caught.value) and "raise max_store_connections to 21" in str(
        caught.value
    )


def test_headroom_leaves_out_reserved_and_used_slots() -> None:
    assert ConnectionHeadroom(100, 3, 40).free == 57
    assert ConnectionHeadroom(10, 3, 12).free == 0
