"""The Python workers of a `local_session` (classic tasks, and the Connect server's) talk to their
executor over a Unix domain socket, not loopback TCP.

Over loopback TCP every Python task of this machine stalled about 40 ms - on a Spark job that
does nothing, two tasks took 97 ms p50 instead of 63 (scratch, 40 jobs): a small batch pays it on
each task, in the plan-to-commit path of every job. What the stall is worth in a batch is measured by
`make bench` (docs/benchmarks.md); this test holds the session to the setting that removes it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any


def _channels(_index: int, rows: Iterator[Any]) -> Iterator[tuple[str, str, str]]:
    """(unix-socket-enabled, directory, name of a Unix socket this worker holds from the daemon)."""
    for _ in rows:
        pass
    directory = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_DIR", "")
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(fd))) as sock:
                if sock.family == socket.AF_UNIX:
                    names.append(str(sock.getsockname()))
        except OSError:  # an fd closed while listed
            continue
    yield os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower(), directory, ";".join(names)


def _held_by_the_daemon(directory: str, names: str) -> bool:
    return bool(directory) and any(n.startswith(directory) and n.endswith(".sock") for n in names.split(";"))


def test_classic_tasks_reach_their_worker_over_a_unix_socket(spark: Any) -> None:
    assert spark.conf.get("spark.python.unix.domain.socket.enabled") == "true"
    seen = spark.sparkContext.parallelize([0, 1], 2).mapPartitionsWithIndex(_channels).collect()
    assert len(seen) == 2
    for enabled, directory, names in seen:
        assert enabled == "true"
        assert _held_by_the_daemon(directory, names), (directory, names)


def test_the_connect_servers_python_workers_use_a_unix_socket(connect_spark: Any) -> None:
    """The DataFrame path (Spark Connect) runs its Python in the server's workers: the same channel."""
    import pyarrow as pa

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ((enabled, directory, names),) = list(_channels(0, iter(batches)))
        yield pa.RecordBatch.from_pydict(
            {"enabled": [enabled], "daemon": [_held_by_the_daemon(directory, names)]}
        )

    rows = (
        connect_spark.range(2, numPartitions=2).mapInArrow(probe, "enabled string, daemon boolean").collect()
    )
    assert [(r.enabled, r.daemon) for r in rows] == [("true", True), ("true", True)]
