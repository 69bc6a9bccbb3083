"""Which snapshot the overview shows: the newest while fresh, a refresh in the background (one at
a time) when not, waited for briefly; the very first one read before the page."""

from __future__ import annotations

import threading
import time

from txn_offsets.service.console.fresh import Freshness
from txn_offsets.service.console.history import LagHistory, RememberedStatuses
from txn_offsets.service.snapshot import Snapshot


class Reads:
    def __init__(self, history: LagHistory, delay_s: float) -> None:
        self.history, self.delay_s, self.count = history, delay_s, 0
        self.lock = threading.Lock()

    def __call__(self) -> Snapshot:
        with self.lock:
            self.count += 1
            n = self.count
        time.sleep(self.delay_s)
        snap = Snapshot(extra={"n": n})
        self.history.record(snap)  # as Service.snapshot does
        return snap


def _fresh(delay_s: float, fresh_s: float, wait_s: float) -> tuple[Freshness, Reads]:
    history = LagHistory()
    reads = Reads(history, delay_s)
    return Freshness(reads, RememberedStatuses(), history, fresh_s=fresh_s, wait_s=wait_s), reads


def test_first_page_waits_then_fresh_ones_are_reused() -> None:
    fresh, reads = _fresh(0.2, fresh_s=60, wait_s=0.01)
    first = fresh.current()  # nothing yet: waits past wait_s for the read
    assert first.snapshot.extra == {"n": 1} and reads.count == 1
    again = fresh.current()
    assert again.snapshot.extra == {"n": 1} and reads.count == 1 and again.age_s < 60


def test_stale_shows_the_previous_at_once_and_refreshes_once() -> None:
    fresh, reads = _fresh(0.5, fresh_s=0, wait_s=0.05)
    fresh.current()
    started = time.monotonic()
    pages = [threading.Thread(target=fresh.current) for _ in range(5)]
    for t in pages:
        t.start()
    for t in pages:
        t.join()
    shown = fresh.current()
    assert time.monotonic() - started < 0.45  # nobody waited for the slow read
    assert shown.snapshot.extra == {"n": 1} and reads.count == 2  # one refresh for all of them
    time.sleep(0.6)
    assert fresh.current().snapshot.extra == {"n": 2}


def test_a_quick_refresh_is_shown_by_the_page_that_asked() -> None:
    fresh, reads = _fresh(0.0, fresh_s=0, wait_s=1.0)
    fresh.current()
    assert fresh.current().snapshot.extra == {"n": 2} and reads.count == 2
