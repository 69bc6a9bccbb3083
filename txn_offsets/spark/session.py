"""Spark sessions: the helpers that make them for examples and tests (loopback only, UI off,
executors on our interpreter), and the probes the library makes on the session it is given.

:func:`local_session` is a classic session. With ``serve_connect=True`` its driver also runs a Spark
Connect server (Spark's ``SparkConnectPlugin``) on a free loopback port behind a random token, and
:func:`connect_client` opens a Spark Connect session to it: no SparkContext, no RDD API, so
``run_job`` takes the DataFrame execution path there. :func:`local_connect_session` does both.

Why not pyspark's ``SparkSession.builder.remote("local[2]")``: it refuses to start while the process
holds a classic session (tests use both), always listens on port 15002 on every interface, and
switches the whole process into Connect mode (``pyspark.sql.functions`` then build Connect columns
for classic sessions too). The server started here is the same Spark Connect service.

The probes (:func:`is_connect`, :func:`session_cores`, :func:`session_key`) import nothing of
pyspark: classic or Connect, its parallelism, a key per session.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from txn_offsets._java import find_java
from txn_offsets.errors import ConfigError

__all__ = [
    "connect_client",
    "connect_url",
    "is_connect",
    "local_connect_session",
    "local_session",
    "session_cores",
    "session_key",
]

_AUTH_SETTING = "spark.connect.authenticate.token"


def local_session(
    app_name: str,
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    serve_connect: bool = False,
) -> Any:  # pyspark.sql.SparkSession (pyspark ships no type information)
    """A SparkSession on `master` bound to 127.0.0.1, with the Spark UI off, Python workers reused
    and reached over a Unix domain socket (loopback TCP stalled each Python task ~40 ms).

    PYSPARK_PYTHON is set to the running interpreter so Python workers import the same installed
    txn_offsets as the driver. Raises :class:`txn_offsets.JavaNotFound` before starting a JVM if
    no Java >= 17 is available. ``serve_connect=True`` also starts a Spark Connect server in the
    driver (needs pyspark's ``connect`` extra in the clients): see :func:`connect_client`.
    """
    java = find_java()
    os.environ.setdefault("JAVA_HOME", os.path.dirname(os.path.dirname(os.path.realpath(java))))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
        # Python workers reach their executor over a Unix socket (Spark >= 4.1): over loopback
        # TCP each Python task stalled ~40 ms here, a third of a small batch (docs/operations.md)
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    if serve_connect:
        settings.update(
            {
                "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": "0",  # a free port, read back by connect_client
                _AUTH_SETTING: secrets.token_hex(16),
            }
        )
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def connect_client(server: Any) -> Any:  # pyspark.sql.connect.session.SparkSession
    """A new Spark Connect session to the Connect server running in `server`, a classic session
    from ``local_session(..., serve_connect=True)``. Each call is a separate server-side session."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.builder.remote(connect_url(server)).create()


def connect_url(server: Any) -> str:
    """The ``sc://`` URL of the Connect server in `server` (it holds the server's token: a secret)."""
    token = server.sparkContext.getConf().get(_AUTH_SETTING)
    if token is None:
        raise ConfigError(
            "serve_connect", "this session runs no Connect server: use local_session(..., serve_connect=True)"
        )
    service = getattr(server._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    port = int(getattr(service, "MODULE$").localPort())
    # "localhost": the client then uses gRPC local credentials, which may carry the token in clear
    return f"sc://localhost:{port}/;token={token}"


def local_connect_session(
    app_name: str, *, master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> Any:  # pyspark.sql.connect.session.SparkSession
    """A Spark Connect session to a local Connect server started in this process on `master`."""
    return connect_client(local_session(app_name, master=master, conf=conf, serve_connect=True))


# -- probes: what kind of session the library was given ------------------------------------------


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (no SparkContext, no RDD API)."""
    # never imports the Connect client (grpc, pandas, pyarrow): if its module is not loaded, no
    # Connect session can exist in this process
    module = sys.modules.get("pyspark.sql.connect.session")
    return module is not None and isinstance(spark, module.SparkSession)


def pinned_threads() -> bool:
    """Whether each Python thread of a classic session's driver has a JVM thread of its own
    (PySpark's pinned-thread mode, the default): a local property a thread sets reaches the Spark
    jobs it starts, and no other thread's."""
    from py4j.clientserver import ClientServer
    from pyspark import SparkContext

    return isinstance(SparkContext._gateway, ClientServer)


@contextlib.contextmanager
def local_property(spark: Any, key: str, value: str) -> Iterator[None]:
    """This thread's Spark jobs carry local property `key` = `value` (classic Spark) while the
    block runs; removed after it."""
    sc = spark.sparkContext
    sc.setLocalProperty(key, value)
    try:
        yield
    finally:
        sc.setLocalProperty(key, None)


_cores: dict[str, int] = {}
_cores_lock = threading.Lock()


def session_cores(spark: Any) -> int:
    """The session's default parallelism: ``defaultParallelism`` on classic Spark; under Connect
    (no SparkContext) the number of partitions of ``spark.range`` without a partition count (the
    same default), found once per session. The last row of a range is always in its last
    partition, so one row tells the count without a shuffle."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    key = str(spark.session_id)
    with _cores_lock:
        if key not in _cores:
            (row,) = spark.range(0, 1).selectExpr("spark_partition_id() AS p").collect()
            _cores[key] = int(row.p) + 1
        return _cores[key]


def session_key(spark: Any) -> str:
    """A key for `spark` that tells its sessions apart (the Connect session id, else the object)."""
    session_id = getattr(spark, "session_id", None)
    return str(session_id) if session_id is not None else str(id(spark))
