"""A local SparkSession for the tests (one per session; local[2], UI off)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from txn_offsets.spark.session import local_session

    # local[2,3]: two cores, and a failed task is retried up to 3 times (as on a cluster)
    session = local_session("txn-offsets-tests", master="local[2,3]")
    yield session
    session.stop()
