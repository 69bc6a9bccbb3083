"""The console's escaping, sparkline, pagination, status words and settings: pure functions."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.admin.console_views import JobLease
from txn_offsets.errors import ConfigError
from txn_offsets.service.console.chart import POINTS, sparkline
from txn_offsets.service.console.markup import text
from txn_offsets.service.console.pages import console_status
from txn_offsets.service.console.paging import Pages, page_number
from txn_offsets.service.console.routes import grafana_from_env


@given(st.text())
def test_text_never_leaves_markup_or_controls(value: str) -> None:
    shown = text(value)
    assert not set("<>\"'") & set(shown)
    assert not any((ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) < 0xA0 for c in shown)
    assert "\u202e" not in shown and "\u200b" not in shown


def test_text_shows_controls_as_escapes() -> None:
    assert text("\x1b[31m<b>x</b>\u202e") == "\\x1b[31m&lt;b&gt;x&lt;/b&gt;\\u202e"
    assert text(None) == "-"
    assert html.unescape(text("a & 'b'")) == "a & 'b'"


def _lease(**over: object) -> JobLease:
    fields: dict[str, object] = {
        "job": "j", "generation": 3, "run_id": "r", "run_host": "h", "live": True, "started_at": None,
        "lease_until": None, "last_commit_at": None, "retired_at": None, "partitions": 1,
    }  # fmt: skip
    return JobLease(**{**fields, **over})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "lag", "retired", "word"),
    [
        ("OK", 0, False, "running"),
        ("LAGGING", 9, False, "lagging"),
        ("STALLED", 9, False, "stalled"),
        ("FENCED", 0, False, "fenced"),
        ("STOPPED", 0, False, "idle"),
        ("STOPPED", 5, False, "stopped with lag"),
        ("OUT_OF_LOG", 0, False, "out of log"),
        (None, None, False, "unknown"),
        ("OK", 0, True, "retired"),
    ],
)
def test_status_words(state: str | None, lag: int | None, retired: bool, word: str) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC) if retired else None
    assert console_status(state, _lease(retired_at=at), lag) == word


def test_sparkline_growing_and_thinned() -> None:
    assert "svg" not in sparkline([(0.0, 5)])
    growing = sparkline([(0.0, 1), (60.0, 5), (120.0, 9)])
    assert 'class="growing"' in growing and "lag from 1 to 9 records over 2 min (max 9)" in growing
    assert 'class="steady"' in sparkline([(0.0, 9), (60.0, 1)])
    many = sparkline([(float(t), t % 7) for t in range(3600)])
    points = re.search(r'points="([^"]+)"', many)
    assert points and len(points.group(1).split()) <= POINTS + 2


@given(st.integers(0, 10_000), st.integers(1, 500), st.integers(-5, 10_000))
def test_pages_cover_every_item_once(total: int, size: int, asked: int) -> None:
    p = Pages(total, size, asked)
    assert 1 <= p.current <= p.count and 0 <= p.offset <= max(0, total - 1)
    assert p.count == max(1, -(-total // size))


def test_page_numbers_never_fail() -> None:
    assert [page_number(x) for x in (None, "", "x", "-1", "0", "3", "9" * 20, "٣")] == [
        1,
        1,
        1,
        1,
        1,
        3,
        1,
        1,
    ]


def test_grafana_url() -> None:
    assert grafana_from_env({}) is None
    assert grafana_from_env({"TXN_OFFSETS_SERVE_GRAFANA_URL": "https://g.example/"}) == "https://g.example"
    with pytest.raises(ConfigError, match="http"):
        grafana_from_env({"TXN_OFFSETS_SERVE_GRAFANA_URL": "javascript:alert(1)"})
