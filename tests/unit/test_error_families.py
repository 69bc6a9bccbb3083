"""Error families: one root whose subclasses all show under ``txn_offsets``; the Transient base is
what run_job retries; ``outcome`` is how a task reports an error instead of raising it."""

from __future__ import annotations

import pickle

import pytest

import txn_offsets
from txn_offsets import errors
from txn_offsets.errors import Transient, TxnOffsetsError

PUBLIC = {
    name: obj
    for name in txn_offsets.__all__
    if isinstance(obj := getattr(txn_offsets, name), type) and issubclass(obj, TxnOffsetsError)
}


def test_every_error_shows_under_the_public_path_and_is_exported() -> None:
    every = {
        obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, TxnOffsetsError)
    }
    assert set(PUBLIC.values()) | {Transient} == every
    for cls in every:
        assert cls.__module__ == "txn_offsets", cls
        assert getattr(txn_offsets, cls.__name__, Transient) is cls


def test_the_transient_family_is_what_planning_again_can_get_past() -> None:
    transient = {name for name, cls in PUBLIC.items() if issubclass(cls, Transient)}
    assert transient == {
        "BatchFailed",
        "ClaimBlocked",
        "CommitNotApplied",
        "KafkaReadError",
        "OffsetsMovedOn",
        "OffsetsRolledBack",
        "ServiceUnavailable",
        "TopicChanged",
        "TopicMissing",
    }
    # never retried into success: their answer cannot change
    for name in ("OffsetConflict", "Fenced", "DataLoss", "RecordRejected", "WriteFailed", "ConfigError"):
        assert not issubclass(PUBLIC[name], Transient), name


def test_outcomes_are_unique_names() -> None:
    # a subclass may report as its parent does (OffsetsMovedOn is a conflict run_job retries)
    outcomes = {name: cls.outcome for name, cls in PUBLIC.items() if "outcome" in vars(cls) and cls.outcome}
    assert len(set(outcomes.values())) == len(outcomes)
    assert errors.OffsetsMovedOn.outcome == "conflict"
    assert outcomes["OffsetConflict"] == "conflict" and outcomes["TopicChanged"] == "topic_changed"
    assert TxnOffsetsError.outcome is None and errors.ServiceUnavailable.outcome is None


@pytest.mark.parametrize(
    "error",
    [
        errors.TopicChanged("t", "a", "b"),
        errors.OffsetConflict("j", "t", 0, 1, 2),
        errors.TopicMissing("t", "gone"),
        errors.DataLoss("j", "t", 0, 5, 0, kind="recreated", stored_topic_id="a", topic_id="b"),
    ],
)
def test_errors_cross_process_boundaries_whole(error: TxnOffsetsError) -> None:
    back = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)
