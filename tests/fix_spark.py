"""A local SparkSession for the tests (one per session; local[2], UI off), and a Spark Connect
session to a Connect server running in that same driver (one per test session)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from txn_offsets.devstack.spark_kafka import spark_kafka_conf
    from txn_offsets.spark.session import local_session

    # local[2,3]: two cores, and a failed task is retried up to 3 times (as on a cluster).
    # serve_connect: the driver also runs a Spark Connect server (on a free loopback port) for the
    # `connect_spark` fixture: one JVM for both kinds of session. Spark's own Kafka source is on the
    # classpath from the start for the real-time mode tests (ADD JAR later is not enough: the
    # driver deserializes the tasks' Kafka offsets with its own class loader)
    session = local_session(
        "txn-offsets-tests", master="local[2,3]", serve_connect=True, conf=spark_kafka_conf()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_spark(spark: Any) -> Iterator[Any]:
    """A Spark Connect session (no SparkContext, no RDD API) to the server in `spark`'s driver."""
    from txn_offsets.spark.session import connect_client

    session = connect_client(spark)
    yield session
    session.stop()
