"""The garbage collector of a Spark Python worker that reads records.

CPython's cyclic collector runs every few hundred container allocations and, now and then,
traverses every object that survived earlier collections. A Python worker holds hundreds of
thousands of such objects before its first record - pyspark, pyarrow, pandas, SQLAlchemy,
confluent-kafka, txn_offsets and the job's own modules - and reading allocates a tuple (and its
bytes) per record, so the collections it triggers traverse that heap again and again. Measured on
one core, 200,000 records of one range read into Arrow batches as the Structured Streaming
adapter's source does: 0.39-0.44 s of CPU, 0.25 s once what was alive before the read is frozen
(``gc.freeze()``: out of the collector's reach), 0.22 s with no collections at all.

:func:`freeze_worker_heap` freezes a worker's heap once, at its first txn_offsets task, after a
full collection. What is frozen is never collected: modules, classes and functions live as long
as the worker anyway; the first task's own objects that become cyclic garbage later stay (once,
bounded). Only inside a Spark task: a driver's heap is its application's.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_asked = threading.Event()  # set by the first call in this process


def freeze_worker_heap() -> bool:
    """Freeze this process's heap if it is a Spark task's worker and was not frozen before; True
    if this call froze it."""
    with _lock:
        if _asked.is_set():
            return False
        _asked.set()
    from pyspark import TaskContext

    if TaskContext.get() is None:  # not inside a Spark task (a driver, a test, a CLI)
        return False
    gc.collect()
    gc.freeze()
    return True
