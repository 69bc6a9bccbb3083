"""SparkSession helpers for examples and tests: loopback only, UI off, executors on our interpreter."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from txn_offsets._java import find_java


def local_session(
    app_name: str,
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> Any:  # pyspark.sql.SparkSession (pyspark ships no type information)
    """A SparkSession on `master` bound to 127.0.0.1, with the Spark UI off.

    PYSPARK_PYTHON is set to the running interpreter so Python workers import the same installed
    txn_offsets as the driver. Raises :class:`txn_offsets.JavaNotFound` before starting a JVM if
    no Java >= 17 is available.
    """
    java = find_java()
    os.environ.setdefault("JAVA_HOME", os.path.dirname(os.path.dirname(os.path.realpath(java))))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.python.worker.reuse", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
