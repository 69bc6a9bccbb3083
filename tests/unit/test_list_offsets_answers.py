"""What a ListOffsets answer without an offset is: the planner never takes it as a log's end.

Found on the lab (chaos L1, 3 of 4 runs): right after the broker leading the job's partitions was
killed -9, the offsets client's answer for the log end was librdkafka's -1001 (no offset); it was
stored as the end, and the planner stopped the job with a false DataLoss ("the stored offset 2000
is above the end of the log (-1001)"). A negative log start or end is now a moving leader, asked
again (metadata._list_offsets), like NOT_LEADER_FOR_PARTITION."""

from __future__ import annotations

from confluent_kafka.admin._listoffsets import OffsetSpec
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.kafka.metadata import _EARLIEST, _LATEST, unknown_mark

OFFSET_INVALID = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_a_real_offset_is_an_answer_for_every_spec(offset: int) -> None:
    at_time = OffsetSpec.for_timestamp(1_700_000_000_000)
    assert not any(unknown_mark(spec, offset) for spec in (_EARLIEST, _LATEST, at_time))


@given(st.integers(min_value=-(2**63), max_value=-1))
def test_a_negative_log_start_or_end_is_no_answer(offset: int) -> None:
    assert unknown_mark(_LATEST, offset) and unknown_mark(_EARLIEST, offset)


def test_a_timestamps_minus_one_is_an_answer_and_invalid_is_not() -> None:
    at_time = OffsetSpec.for_timestamp(1_700_000_000_000)
    assert not unknown_mark(at_time, -1)  # no record at or after that time: the end is asked next
    assert unknown_mark(at_time, OFFSET_INVALID)
    assert unknown_mark(_LATEST, OFFSET_INVALID) and unknown_mark(_EARLIEST, -1)
