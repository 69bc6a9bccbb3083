"""Records as Arrow batches (the DataFrame path's records, BatchWriter's and the streaming
source's): every field of every record in its column, in order, in chunks of the batch size; the
cyclic collector off while they are made (txn_offsets.spark.heap.collector_paused)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from txn_offsets.kafka.records import Record
from txn_offsets.spark.frames import arrow_batches
from txn_offsets.spark.heap import collector_paused

_BYTES = st.none() | st.binary(max_size=12)
_HEADERS = st.lists(st.tuples(st.text(max_size=4), _BYTES), max_size=2).map(tuple)
_RECORDS = st.lists(
    st.builds(
        Record,
        topic=st.sampled_from(["a", "b.c"]),
        partition=st.integers(0, 4_095),
        offset=st.integers(0, 2**62),
        key=_BYTES,
        value=_BYTES,
        timestamp_ms=st.none() | st.integers(0, 2**41),
        headers=st.just(()) | _HEADERS,
    ),
    max_size=40,
)


def _row(rec: Record) -> dict[str, object]:
    ts = None if rec.timestamp_ms is None else datetime.fromtimestamp(rec.timestamp_ms / 1000, UTC)
    return {
        "key": rec.key,
        "value": rec.value,
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": ts,
        "headers": [{"key": k, "value": v} for k, v in rec.headers],
    }


@settings(max_examples=200, deadline=None)
@given(records=_RECORDS, batch_size=st.integers(1, 16))
def test_every_record_is_one_row_of_its_fields_in_order(records: list[Record], batch_size: int) -> None:
    batches = list(arrow_batches(iter(records), batch_size))
    assert [b.num_rows for b in batches] == [
        min(batch_size, len(records) - i) for i in range(0, len(records), batch_size)
    ]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
    assert all(b.schema.names == names for b in batches)
    assert [row for b in batches for row in b.to_pylist()] == [_row(r) for r in records]


def test_timestamps_are_microseconds_in_utc() -> None:
    (batch,) = arrow_batches([Record("t", 0, 5, None, b"v", 1_700_000_000_123)], 10)
    column = batch.column("timestamp")
    assert str(column.type) == "timestamp[us, tz=UTC]"
    assert column.cast("int64").to_pylist() == [1_700_000_000_123_000]


def test_the_collector_is_off_while_records_become_arrow_and_back_on_after() -> None:
    seen: list[bool] = []

    def records() -> Iterator[Record]:
        for i in range(5):
            seen.append(gc.isenabled())
            yield Record("t", 0, i, None, b"v", None)

    assert gc.isenabled()
    batches = arrow_batches(records(), 2)
    first = next(batches)
    assert (first.num_rows, seen, gc.isenabled()) == (2, [False, False], False)  # paused meanwhile
    assert sum(b.num_rows for b in batches) == 3
    assert gc.isenabled()
    stopped = arrow_batches(records(), 2)
    next(stopped)
    stopped.close()  # a reader stopped early (a failed task): the collector is back on too
    assert gc.isenabled()


def test_overlapping_pauses_end_with_the_last_and_an_application_off_stays_off() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer read still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # switched off by the application: left as it was
    finally:
        gc.enable()
