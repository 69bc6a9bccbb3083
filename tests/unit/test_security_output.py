"""Issue 42, item 8: text a tenant wrote (a job name, a run id, an audit reason) reaches the admin's
terminal through the CLI's tables: every control character in every cell is printed as its escape
(ESC as \\x1b, a newline as \\n), so it can neither drive the terminal nor forge rows. JSON output
is unchanged (JSON escapes them itself). The CLI against real PostgreSQL:
tests/integration/test_security_settings.py."""

from __future__ import annotations

import io
import json

from txn_offsets.admin.moves import Move
from txn_offsets.cli.output import emit_json, print_moves, table

EVIL = "red\x1b[31m\nFAKE-ROW 0 idle\r\x07\x00\x7f\x9b2J\u202egnp.exe\u2028end\tX"
SHOWN = "red\\x1b[31m\\nFAKE-ROW 0 idle\\r\\x07\\x00\\x7f\\x9b2J\\u202egnp.exe\\u2028end\\tX"


def _table(header: list[str], rows: list[tuple[object, ...]]) -> str:
    out = io.StringIO()
    table(header, rows, out=out)
    return out.getvalue()


def test_every_cell_shows_control_characters_as_escapes() -> None:
    text = _table(["JOB", "RUN", "N"], [(EVIL, "run\x1b]0;pwned\x07", 3), ("plain", None, 4)])
    lines = text.splitlines()
    assert len(lines) == 3, lines  # the header and two rows: no row forged by a newline
    assert lines[1].startswith(SHOWN + "  ")
    assert "run\\x1b]0;pwned\\x07" in lines[1]
    assert lines[2].split() == ["plain", "-", "4"]
    # nothing but the line ends is a control character
    assert not [c for c in text.replace("\n", "") if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F]
    assert "\u202e" not in text and "\u2028" not in text


def test_columns_are_aligned_on_the_escaped_text() -> None:
    lines = _table(["A", "B"], [("x\x1by", "1"), ("long-cell", "2")]).splitlines()
    assert lines[1:] == ["x\\x1by     1", "long-cell  2"]  # widths count the escapes as shown


def test_the_header_is_escaped_too_and_ordinary_text_is_left_alone() -> None:
    text = _table(["H\x1b"], [("naïve, ünïcode 日本 \\n stays",)])
    assert text.splitlines() == ["H\\x1b", "naïve, ünïcode 日本 \\n stays"]


def test_json_output_is_unchanged() -> None:
    out = io.StringIO()
    emit_json([{"job": EVIL}], out=out)
    assert json.loads(out.getvalue()) == [{"job": EVIL}]
    assert "\x1b" not in out.getvalue()  # JSON's own \u001b escape


def test_move_plans_escape_topic_names(capsys) -> None:  # type: ignore[no-untyped-def]
    print_moves("plan:", [Move("t\x1b[2J", 0, 5, 7)])
    out = capsys.readouterr().out
    assert "t\\x1b[2J[0]  5 -> 7  (+2)" in out and "\x1b" not in out
