"""A driver's heap is frozen while its runs run and unfrozen when the last ends
(txn_offsets.spark.heap.heap_frozen_while_running): overlapping runs are counted, an error still
unfreezes, and a heap the application froze itself is left as it is."""

from __future__ import annotations

import gc

import pytest

from txn_offsets.spark.heap import heap_frozen_while_running


@pytest.fixture(autouse=True)
def _unfrozen() -> None:
    gc.unfreeze()


def test_frozen_from_the_first_run_to_the_end_of_the_last() -> None:
    assert gc.get_freeze_count() == 0
    with heap_frozen_while_running():
        frozen = gc.get_freeze_count()
        assert frozen > 0  # this test's modules, pytest's, ...
        with heap_frozen_while_running():  # a second run (run_jobs, a thread) overlapping it
            assert gc.get_freeze_count() == frozen  # not frozen again
        assert gc.get_freeze_count() == frozen  # the first run still runs
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), heap_frozen_while_running():
        raise RuntimeError("a failed run")
    assert gc.get_freeze_count() == 0


def test_a_heap_the_application_froze_is_left_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with heap_frozen_while_running():
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == frozen
    gc.unfreeze()
