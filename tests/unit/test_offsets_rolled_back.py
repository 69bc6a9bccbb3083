"""A stored offset BEHIND a range's start, at the run's own generation, is the database having
lost its last commits under the run (a failover to an asynchronous replica, a restore): resets bump
the generation (Fenced) and refuse while a run is live, so nothing else moves an offset back. It is
transient: planning again from the stored offsets re-reads the lost records from Kafka (F15). An
offset ahead of the start that is not the range's end stays an OffsetConflict."""

from __future__ import annotations

import pickle

import pytest

import txn_offsets
from txn_offsets.commit.classify import Settled, classify_claim, classify_reread
from txn_offsets.errors import OffsetConflict, Transient
from txn_offsets.ranges import OffsetRange

RNG = OffsetRange("t", 3, 186, 217)


@pytest.mark.parametrize("found", [0, 93, 185])
def test_claim_behind_the_start_is_transient(found: int) -> None:
    with pytest.raises(Transient) as info:
        classify_claim("j", RNG, found, 7, 7)
    err = info.value
    assert type(err).__name__ == "OffsetsRolledBack" and err is not None
    assert not isinstance(err, OffsetConflict)
    assert (err.job, err.topic, err.partition, err.expected, err.found) == ("j", "t", 3, 186, found)  # type: ignore[attr-defined]
    assert "t[3]" in str(err) and "186" in str(err) and str(found) in str(err)
    assert "plan" in str(err)
    back = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes
    assert type(back) is type(err) and vars(back) == vars(err)
    assert txn_offsets.OffsetsRolledBack is type(err)


def test_reread_behind_the_start_is_transient() -> None:
    other = OffsetRange("t", 4, 10, 20)
    with pytest.raises(Transient):
        classify_reread("j", [RNG, other], {RNG.key: 93, other.key: 10}, 7, 7)
    assert classify_reread("j", [RNG, other], {RNG.key: 186, other.key: 10}, 7, 7) is Settled.AT_START


@pytest.mark.parametrize("found", [200, 300, None])
def test_ahead_or_missing_stays_a_conflict(found: int | None) -> None:
    with pytest.raises(OffsetConflict):
        classify_claim("j", RNG, found, 7, 7)
