"""What the runs table keeps of a failure (store.run_ends.failure_of): the error's class and a
one-line cause with no record data - the message only of errors made of the store's facts, else
the classes the error was raised from."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.errors import BatchFailed, OffsetConflict, RecordRejected
from txn_offsets.store.run_ends import CAUSE_CHARS, failure_of


class UserError(Exception):
    pass


def _raised(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


@given(st.text(min_size=1))
def test_a_users_text_is_never_kept(payload: str) -> None:
    """Whatever the text, what is kept is the same: it is made of class names only."""
    user = f"{__name__}.UserError"
    assert failure_of(_raised(BatchFailed("j", 1, payload), UserError(payload))) == (
        "BatchFailed",
        f"caused by {user}",
    )
    assert failure_of(RecordRejected("t", 0, 5, payload)) == ("RecordRejected", None)
    assert failure_of(UserError(payload)) == (user, None)
    assert failure_of(_raised(ValueError(payload), KeyError(payload))) == ("ValueError", "caused by KeyError")


def test_classes_and_causes() -> None:
    assert failure_of(_raised(BatchFailed("j", 1, "x"), UserError("card"))) == (
        "BatchFailed",
        f"caused by {__name__}.UserError",
    )
    assert failure_of(UserError("card")) == (f"{__name__}.UserError", None)
    assert failure_of(KeyboardInterrupt()) == ("KeyboardInterrupt", None)
    conflict = OffsetConflict("j", "t", 0, 4, 9)
    name, cause = failure_of(conflict)
    assert name == "OffsetConflict" and cause == str(conflict).splitlines()[0][:CAUSE_CHARS]
    long = OffsetConflict("j" * 400, "t", 0, 4, 9)
    assert len(failure_of(long)[1] or "") == CAUSE_CHARS
