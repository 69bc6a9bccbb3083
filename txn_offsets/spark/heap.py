"""The garbage collector of the processes that run batches: a Python worker's and a driver's.

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
bounded). Only inside a Spark task.

A driver's heap is its application's, and its run loop allocates per batch what lives about a
batch - the plan (a dict and a range per partition), the tasks' reports (one per range, the
summary keeps the last 10,000) - the pattern that triggers full collections: at 4,096 partitions
five or six a run of eight batches, 0.45-1.1 s of the driver's time between batches (~140 ms
each, most of it traversing the application's heap). :func:`heap_frozen_while_running` freezes
what is alive when a run starts (no collection first: nothing is collected early) and unfreezes
it when the last run in the process ends, so nothing of the application's stays out of the
collector's reach after its runs: during them, what was alive at the start and becomes cyclic
garbage waits for the end (freed then), and a full collection traverses what the runs allocated.

Even with the heap frozen, a read into Arrow batches still paid the collections its own records
trigger (a tuple per record, thousands held in the chunk being built): 320,000 page views read
into chunks of 2,000 took 5.7-6.3 us of CPU a record, 3.4-4.0 with no collections (one process,
the heap frozen first). :func:`collector_paused` switches the collector off while such a read runs:
records and Arrow chunks hold no reference cycles, and reference counting frees them as ever; only
cyclic garbage made meanwhile waits for the next collection after it. For our own reads only
(records -> Arrow, nothing of the user's runs in between), never around a user's function.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

__all__ = ["collector_paused", "freeze_worker_heap", "heap_frozen_while_running"]

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


class _Switch:
    """A process-wide collector setting held by overlapping blocks (runs, reads, threads): `take`
    sets it when the first block begins and says whether it changed anything; `give_back` undoes
    that when the last block ends - never what the application had set itself."""

    def __init__(self, take: Callable[[], bool], give_back: Callable[[], None]) -> None:
        self._take, self._give_back = take, give_back
        self._holders = 0
        self._took = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with _lock:
            self._holders += 1
            if self._holders == 1:
                self._took = self._take()
        try:
            yield
        finally:
            with _lock:
                self._holders -= 1
                if self._holders == 0 and self._took:
                    self._give_back()
                    self._took = False


def _freeze() -> bool:
    if gc.get_freeze_count():  # the application froze it: left as it is
        return False
    gc.freeze()
    return True


def _unfreeze() -> None:
    gc.unfreeze()


def _disable() -> bool:
    was = gc.isenabled()
    gc.disable()
    return was


def _enable() -> None:
    gc.enable()


_frozen = _Switch(_freeze, _unfreeze)
_paused = _Switch(_disable, _enable)


def heap_frozen_while_running() -> contextlib.AbstractContextManager[None]:
    """A driver's run (see the module): what is alive when the first of this process's runs starts
    is frozen until the last of them ends. Runs overlap (run_jobs, threads): counted. A process
    whose heap is frozen already (the application froze it) is left as it is."""
    return _frozen.held()


def collector_paused() -> contextlib.AbstractContextManager[None]:
    """The cyclic collector off while the block runs (see the module), back on when the last
    overlapping block ends - unless it was off before the first began."""
    return _paused.held()
