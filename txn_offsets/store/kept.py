"""The driver's Store of a run that ended cleanly, kept for the process's next run on the same settings.

Every run used to make an engine of its own and close it at its end, so a process running runs one
after another (a scheduler's loop, a notebook, the benchmarks) paid each run a first connection:
TLS, authentication, the pooler check of :mod:`txn_offsets.store.pooler` and SQLAlchemy's
first-connect queries - 26-37 ms a run on a busy 2-core machine, a fifth of what a run's start and
end cost there. Now a run that ended cleanly leaves its Store here, its idle connections open, for
:data:`KEEP_S` seconds; the next run on the same settings takes it (:func:`run_store`).

Each run still has its engine - its connection budget (:mod:`txn_offsets.store.budget`) - to
itself: a kept Store is taken by one run at a time, and one is kept per settings (a newer one
replaces and closes the older). A kept Store is pinged when taken (one round trip), so a server
restarted in between costs a new engine, not the run; a run that failed closes its engine at once
(its connections may be why it failed: a database that went away, a primary become a standby).
What is kept is closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass, field

from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store

__all__ = ["KEEP_S", "close_kept_stores", "release_run_store", "run_store"]

#: how long a clean run's Store waits, its connections open, for the process's next run
KEEP_S = 30.0


@dataclass
class _Kept:
    """A Store kept for the next run, and the timer that closes it unless a run takes it first."""

    store: Store
    timer: threading.Timer = field(init=False)

    def __post_init__(self) -> None:
        self.timer = threading.Timer(KEEP_S, _expire, (self,))
        self.timer.daemon = True

    def close(self) -> None:
        self.timer.cancel()
        self.store.engine.dispose()


_kept: dict[DatabaseSettings, _Kept] = {}
_lock = threading.Lock()


def run_store(db: DatabaseSettings) -> Store:
    """The driver's Store of a run that starts now: the one a run on `db` that ended cleanly at most
    :data:`KEEP_S` ago left (:func:`release_run_store`), pinged; else one on a new engine."""
    with _lock:
        kept = _kept.pop(db, None)
    if kept is None:
        return Store.of(db)
    kept.timer.cancel()
    try:  # one round trip: a server restarted meanwhile must not fail the run on a dead connection
        with kept.store.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception:  # any failure: a new engine (its own error, if any, is the run's)
        kept.close()
        return Store.of(db)
    return kept.store


def release_run_store(store: Store, *, clean: bool) -> None:
    """A run on `store` ended: keep it for the next run on its settings when the run ended `clean`ly
    (closed after KEEP_S unless taken; one kept before on the same settings is closed now); close
    its engine at once otherwise."""
    if not clean:
        store.engine.dispose()
        return
    kept = _Kept(store)
    with _lock:
        replaced = _kept.pop(store.settings, None)
        _kept[store.settings] = kept
    if replaced is not None:
        replaced.close()
    kept.timer.start()


def _expire(kept: _Kept) -> None:
    with _lock:
        if _kept.get(kept.store.settings) is not kept:
            return  # taken by a run (or replaced) meanwhile
        del _kept[kept.store.settings]
    kept.close()


def close_kept_stores() -> None:
    """Close every Store kept for a next run (at interpreter exit; tests)."""
    with _lock:
        kept = list(_kept.values())
        _kept.clear()
    for one in kept:
        one.close()


atexit.register(close_kept_stores)  # the server sees a clean goodbye from a kept engine too
