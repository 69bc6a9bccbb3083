"""A run's batch deadlines on one thread (spark.batch.Deadlines): the interrupt fires once for a
batch still running after its timeout, never for a batch that ended in time or has no timeout, is
armed again for the next batch, and a closed one refuses new batches."""

from __future__ import annotations

import threading
import time

import pytest

from txn_offsets.spark.batch import Deadlines


class Interrupts:
    def __init__(self) -> None:
        self.calls = 0
        self.called = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.called.set()


def test_a_batch_past_its_timeout_is_interrupted_once() -> None:
    interrupt = Interrupts()
    deadlines = Deadlines(interrupt)
    try:
        with deadlines.during("b1", 0.05) as expired:
            assert interrupt.called.wait(5)
            time.sleep(0.1)  # still running well past it: one interrupt, not one per wait
        assert expired.is_set() and interrupt.calls == 1
    finally:
        deadlines.close()


def test_batches_that_end_in_time_or_have_no_timeout_are_never_interrupted() -> None:
    interrupt = Interrupts()
    deadlines = Deadlines(interrupt)
    try:
        for number in range(20):
            with deadlines.during(f"b{number}", 0.2) as expired:
                pass
            assert not expired.is_set()
        with deadlines.during("none", None) as expired:
            time.sleep(0.3)
        time.sleep(0.3)  # past every deadline that was armed: none fires after its batch ended
        assert interrupt.calls == 0 and not expired.is_set()
    finally:
        deadlines.close()


def test_the_next_batch_is_armed_again_after_one_expired() -> None:
    interrupt = Interrupts()
    deadlines = Deadlines(interrupt)
    try:
        for expected in (1, 2):
            interrupt.called.clear()
            with deadlines.during(f"b{expected}", 0.05) as expired:
                assert interrupt.called.wait(5)
            assert expired.is_set() and interrupt.calls == expected
    finally:
        deadlines.close()


def test_a_closed_deadlines_refuses_a_batch() -> None:
    deadlines = Deadlines(Interrupts())
    with deadlines.during("b1", 1.0):
        pass
    deadlines.close()
    with pytest.raises(RuntimeError, match="closed"), deadlines.during("b2", 1.0):
        pass
