"""The examples' page-view decoder is strict: a record that is not a page view raises (and is then
rejected with its offset, or dead-lettered), never converted into a wrong one."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pageviews import PageView, decode
from txn_offsets.kafka.records import Record


def record(value: bytes | None) -> Record:
    return Record("t", 0, 0, None, value, None, ())


TEXT = st.text(st.characters(exclude_categories=("Cs",)))  # lone surrogates are not UTF-8


@given(
    user=TEXT,
    page=TEXT,
    time_ms=st.integers(0, 2**62),
    duration_ms=st.integers(-(2**62), 2**62),
)
def test_a_page_view_round_trips(user: str, page: str, time_ms: int, duration_ms: int) -> None:
    value = json.dumps({"u": user, "p": page, "t": time_ms, "d": duration_ms}).encode()
    assert decode(record(value)) == PageView(user, page, time_ms, duration_ms)


def test_unknown_fields_are_ignored() -> None:
    value = b'{"u":"user-1","p":"/page/2","t":1000,"d":20,"referrer":"x"}'
    assert decode(record(value)) == PageView("user-1", "/page/2", 1000, 20)


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b'{"u":"user-1","p":"/page/2","t":1000}',  # no duration
        b'{"u":"user-1","p":"/page/2","t":"1000","d":20}',  # a string time
        b'{"u":"user-1","p":"/page/2","t":1000.5,"d":20}',  # a float time (was truncated)
        b'{"u":17,"p":"/page/2","t":1000,"d":20}',  # a number user (was str()-ed)
        b'{"u":"user-1","p":null,"t":1000,"d":20}',
        b'["user-1","/page/2",1000,20]',
        b"\xff\xfe{}",
    ],
)
def test_what_is_not_a_page_view_raises(value: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):  # ValidationError (a wrong type) is one too
        decode(record(value))


def test_an_empty_value_raises() -> None:
    with pytest.raises(ValueError, match="empty value"):
        decode(record(None))
