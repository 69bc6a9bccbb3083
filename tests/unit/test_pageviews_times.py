"""The examples' generator stamps every record within what Kafka accepts: never more than an hour
ahead (log.message.timestamp.after.max.ms, INVALID_TIMESTAMP) nor past a 7-day retention, at any
data set size (a 1,300,000-record topic used to fail with INVALID_TIMESTAMP half way)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pageviews import MAX_STEP_MS, first_event_time, transactions

NOW_MS = 1_795_000_000_000
HOUR_MS = 3_600_000
WEEK_MS = 7 * 24 * HOUR_MS


@given(
    messages=st.integers(0, 10_000_000),
    per_transaction=st.integers(1, 20_000),
    abort_every=st.sampled_from([0, 2, 3, 10, 50]),
)
def test_every_event_time_is_between_a_week_and_an_hour_ago(
    messages: int, per_transaction: int, abort_every: int
) -> None:
    if messages // per_transaction > 20_000:  # keep the walk over the transactions short
        per_transaction = messages // 20_000 + 1
    txns = list(transactions(messages, per_transaction, abort_every))
    assert sum(n for n, aborted in txns if not aborted) == messages
    produced = sum(n for n, _ in txns)
    first = first_event_time(NOW_MS, messages, per_transaction, abort_every)
    last_possible = first + produced * MAX_STEP_MS
    assert last_possible <= NOW_MS - HOUR_MS
    assert first >= NOW_MS - WEEK_MS


def test_the_million_record_benchmark_topic_ends_in_the_past() -> None:
    # make bench's full size: 1,000,000 committed records, transactions of 5,000, every 10th aborted
    produced = sum(n for n, _ in transactions(1_000_000, 5_000, 10))
    assert produced == 1_000_000 + 22 * 5_000
    assert first_event_time(NOW_MS, 1_000_000, 5_000, 10) + produced * MAX_STEP_MS <= NOW_MS - HOUR_MS


@pytest.mark.parametrize(("abort_every", "per_transaction"), [(1, 10), (-1, 10), (10, 0)])
def test_bad_arguments_are_named(abort_every: int, per_transaction: int) -> None:
    from examples import pageviews

    name = "abort_every" if per_transaction else "per_transaction"
    with pytest.raises(ValueError, match=name):
        pageviews.produce("127.0.0.1:1", "t", 10, per_transaction=per_transaction, abort_every=abort_every)
