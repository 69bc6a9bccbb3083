"""A driver's heap is frozen while its runs run and unfrozen when the last ends
(txn_offsets.spark.heap.heap_frozen_while_running): overlapping runs are counted, an error still
unfreezes, and a heap the application froze itself is left as it is. The collector's calls are
counted (the freeze count itself moves while other threads of the test process free objects)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from txn_offsets.spark.heap import heap_frozen_while_running


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    gc.unfreeze()
    made: list[str] = []

    def counted(name: str, real: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            made.append(name)
            real()

        return call

    monkeypatch.setattr(gc, "freeze", counted("freeze", gc.freeze))
    monkeypatch.setattr(gc, "unfreeze", counted("unfreeze", gc.unfreeze))
    return made


def test_frozen_from_the_first_run_to_the_end_of_the_last(calls: list[str]) -> None:
    with heap_frozen_while_running():
        assert calls == ["freeze"] and gc.get_freeze_count() > 0
        with heap_frozen_while_running():  # a second run (run_jobs, a thread) overlapping it
            assert calls == ["freeze"]  # not frozen again
        assert calls == ["freeze"] and gc.get_freeze_count() > 0  # the first run still runs
    assert calls == ["freeze", "unfreeze"] and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), heap_frozen_while_running():
        raise RuntimeError("a failed run")
    assert calls == ["freeze", "unfreeze"] * 2 and gc.get_freeze_count() == 0


def test_a_heap_the_application_froze_is_left_frozen(calls: list[str]) -> None:
    gc.freeze()  # the application's own
    del calls[:]
    with heap_frozen_while_running():
        assert gc.get_freeze_count() > 0
    assert calls == [] and gc.get_freeze_count() > 0  # neither frozen again nor unfrozen
    gc.unfreeze()
