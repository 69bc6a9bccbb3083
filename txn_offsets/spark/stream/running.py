"""What a run's streaming query is in either mode (``open_stream``'s micro-batches,
``open_realtime``'s real-time mode): its checkpoint's place and how its files are written, its
start (logged with the run and the checkpoint) and its end - the query stopped if it runs, then the
run's lifecycle closed (the lease released, the engine disposed), once, whatever the stop raised.

A run's checkpoint only follows the offset table (each run has one of its own; the sink commits the
stored plan's ranges under the guard), so on the local file system its query writes it through
Hadoop's FileSystem API instead of Spark's default FileContext one. Without Hadoop's native library
(pip's pyspark has none) the FileContext path starts a ``readlink`` process for each link status it
asks - ~230 processes a micro-batch here, 100-150 ms of each batch's offset and commit log writes
(docs/benchmarks.md, twenty-first pass). The FileSystem API's rename is not atomic on every file
system, which is why Spark does not default to it; on a local POSIX file system it is, though it
does not refuse a log file that another query wrote meanwhile - which a run's checkpoint never
meets: one query reads a run's stream (a second fails at its start), and the guard decides what
commits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import urllib.parse
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from txn_offsets.spark.session import is_connect
from txn_offsets.store.runs import Run

__all__ = ["RunQuery", "checkpoint_files", "file_system_manager", "run_checkpoint"]

logger = logging.getLogger(__name__)

# Spark's SQL setting that names a query's checkpoint file manager (read when the query is built:
# the query keeps a copy of its session's settings), and the FileSystem-API manager in the Spark
# versions txn_offsets supports (4.3 moved it into a package of its own)
MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


def run_checkpoint(root: str, schema: str, run: Run) -> str:
    """The checkpoint of one run of a stream: ``<root>/<schema>/<job>/generation-<g>-<run digest>``."""
    job = urllib.parse.quote(run.job, safe="")
    digest = hashlib.sha256(run.run_id.encode()).hexdigest()[:12]
    return f"{root}/{schema}/{job}/generation-{run.generation}-{digest}"


def file_system_manager(spark: Any, checkpoint: str) -> str | None:
    """The FileSystem-API checkpoint file manager for a query of `spark` checkpointing at
    `checkpoint`, or None to leave Spark's choice: when the session is not a classic one (a Spark
    Connect client cannot ask the server's Hadoop settings), the session names a manager itself,
    the checkpoint's file system is not the local one (``fs.defaultFS`` decides for a path without
    a scheme), or this Spark has no such manager."""
    if is_connect(spark) or spark.conf.get(MANAGER_SETTING, None) is not None:
        return None
    from py4j.protocol import Py4JError

    jvm = spark._jvm
    hadoop = spark._jsparkSession.sessionState().newHadoopConf()
    try:
        scheme = str(jvm.org.apache.hadoop.fs.Path(checkpoint).getFileSystem(hadoop).getScheme())
    except Py4JError:  # no file system for its scheme here, a malformed path: Spark's start says so
        return None
    if scheme != "file":
        return None
    loadable = jvm.org.apache.spark.util.Utils.classIsLoadable
    return next((name for name in FILE_SYSTEM_MANAGERS if loadable(name)), None)


@contextlib.contextmanager
def checkpoint_files(spark: Any, checkpoint: str) -> Iterator[str | None]:
    """While the block starts a query checkpointing at `checkpoint`: on the local file system,
    Spark's FileSystem-API checkpoint file manager for it (:func:`file_system_manager`; yields its
    name, or None when Spark's own choice stands). The session's setting is back as it was when the
    block ends; the query keeps the copy it took when it was built. Another query that a thread of
    the application builds on the same session during the block takes it too."""
    manager = file_system_manager(spark, checkpoint)
    if manager is None:
        yield None
        return
    spark.conf.set(MANAGER_SETTING, manager)
    try:
        yield manager
    finally:
        spark.conf.unset(MANAGER_SETTING)


class RunQuery:
    """The shared part of TxnStream and RealTimeStream (their ``__init__`` sets the four fields)."""

    spark: Any
    query: Any
    _closed: bool
    _lifecycle: contextlib.ExitStack

    def _launch(self, writer: Any, run: Run, what: str, checkpoint: str) -> Any:
        with checkpoint_files(self.spark, checkpoint) as manager:
            logger.info(
                "job=%r generation=%d: starting the %s, checkpoint %s%s",
                run.job,
                run.generation,
                what,
                checkpoint,
                " (written through Hadoop's FileSystem API)" if manager else "",
            )
            self.query = writer.start()
        return self.query

    def _forget(self) -> None:
        """What else closing ends, before the run itself (nothing here)."""

    def close(self) -> None:
        """Stop the query (if running) and release the run's lease."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.query is not None and self.query.isActive:
                self.query.stop()
        finally:
            try:
                self._forget()
            finally:
                self._lifecycle.close()  # releases the lease (quietly) and closes the engine

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
