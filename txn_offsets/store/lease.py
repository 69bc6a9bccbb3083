"""The lease of a live run kept while its batches run: a background thread renews it.

A batch longer than the lease must not let a second run start without ``force``; a batch that no
longer makes progress must not hold the job forever (renewals stop after the batch's timeout).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.store.runs import Run, heartbeat

__all__ = ["LeaseKeeper", "keep_lease"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def keep_lease(
    engine: sa.Engine, db: DatabaseSettings, run: Run, *, every_s: float, for_s: float | None = None
) -> Iterator[None]:
    """Renew the lease from a background thread while a batch runs, so a batch longer than the
    lease does not let a second run start without ``force``. A failed renewal is only logged:
    if the run was fenced, its claims fail with Fenced anyway and nothing is written.

    With `for_s` (the batch's timeout) renewals stop after that long: a batch that no longer makes
    progress must not hold the job forever."""
    keeper = LeaseKeeper(engine, db, run, every_s=every_s)
    try:
        with keeper.during(for_s):
            yield
    finally:
        keeper.close()


class LeaseKeeper:
    """:func:`keep_lease` for a run of many batches: one thread for the whole run, armed for each
    batch with :meth:`during` (starting a thread per batch cost milliseconds per batch). Renews
    the lease every `every_s` while armed and only then; never past the batch's `for_s`."""

    def __init__(self, engine: sa.Engine, db: DatabaseSettings, run: Run, *, every_s: float) -> None:
        self._engine, self._db, self._run, self._every_s = engine, db, run, every_s
        self._cond = threading.Condition()
        self._armed = False
        self._closed = False
        self._next = 0.0  # monotonic time of the next renewal
        self._deadline: float | None = None  # no renewal after this (the batch's timeout)
        self._thread: threading.Thread | None = None
        self._renewing = False

    @contextlib.contextmanager
    def during(self, for_s: float | None = None) -> Iterator[None]:
        """Keep the lease while the block runs (a batch), for at most `for_s` seconds."""
        now = time.monotonic()
        with self._cond:
            if self._closed:
                raise RuntimeError("LeaseKeeper is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"lease-{self._run.job}", daemon=True)
                self._thread.start()
            self._armed = True
            self._next = now + self._every_s
            self._deadline = None if for_s is None else now + for_s
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._armed = False
                self._cond.notify_all()
                while self._renewing:  # a renewal in flight ends before the batch does
                    self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self._every_s + 5)

    def _due(self) -> bool:
        """Wait (holding the condition) until a renewal is due; False once closed."""
        while not self._closed:
            now = time.monotonic()
            if not self._armed:
                self._cond.wait()
            elif self._deadline is not None and now >= self._deadline:
                logger.warning(
                    "job %r: batch past its timeout; the lease is no longer renewed", self._run.job
                )
                self._armed = False
            elif now < self._next:
                self._cond.wait(self._next - now)
            else:
                self._next = now + self._every_s
                return True
        return False

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._due():
                    return
                self._renewing = True
            try:
                heartbeat(self._engine, self._db, self._run)
            except Exception as exc:
                logger.warning("job %r: lease renewal failed: %s", self._run.job, exc)
            finally:
                with self._cond:
                    self._renewing = False
                    self._cond.notify_all()
