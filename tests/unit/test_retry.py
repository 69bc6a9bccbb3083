"""The run loops' retry after a transient failure (txn_offsets.spark.retry), shared by the batch
runner and the low-latency epochs."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.errors import ServiceUnavailable
from txn_offsets.spark.retry import MAX_DELAY_S, TransientRetries


def _retries(retries: int, backoff_s: float, stop: threading.Event | None = None) -> TransientRetries:
    return TransientRetries("j", retries, backoff_s, stop or threading.Event())


@given(st.floats(min_value=0, max_value=100), st.integers(min_value=1, max_value=60))
def test_the_backoff_doubles_from_the_base_and_is_capped(backoff_s: float, failures: int) -> None:
    r = _retries(100, backoff_s)
    r.failures = failures
    assert r.delay() == min(MAX_DELAY_S, backoff_s * 2 ** (failures - 1))
    assert 0 <= r.delay() <= MAX_DELAY_S


def test_retries_in_a_row_then_the_error_and_a_success_resets(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    stop.set()  # the waits return at once (a stop ends them)
    r = _retries(2, 0.5, stop)
    err = ServiceUnavailable("PostgreSQL", "h/db", "connection refused")
    with caplog.at_level(logging.WARNING, logger="txn_offsets.spark.retry"):
        r.wait_after(err)
        r.wait_after(err)
        with pytest.raises(ServiceUnavailable) as raised:
            r.wait_after(err)
    assert raised.value is err
    warnings = [rec.getMessage() for rec in caplog.records]
    assert len(warnings) == 2
    assert "planning again from the stored offsets in 0.5s (retry 1 of 2)" in warnings[0]
    assert "in 1.0s (retry 2 of 2)" in warnings[1]
    r.succeeded()
    assert r.failures == 0
    r.wait_after(err)  # a fresh count after a success
    assert r.failures == 1


def test_no_retries_raises_the_first_failure() -> None:
    err = ServiceUnavailable("PostgreSQL", "h/db", "down")
    with pytest.raises(ServiceUnavailable):
        _retries(0, 1.0).wait_after(err)
