"""Logging setup (text or JSON lines, third-party chatter quiet) and the CLI's progress display
(rich on a terminal, plain lines otherwise)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from txn_offsets.cli import output
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.logs import configure_logging, log_format_from_env
from txn_offsets.redaction import Secret


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("alembic", "uvicorn", "uvicorn.access")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)


def test_json_lines_without_secrets(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(logging.INFO, fmt="json", stream=stream)
    db = DatabaseSettings(Secret("postgresql+psycopg://u:pw-secret-7@db/x"))
    log = logging.getLogger("txn_offsets.spark.runner")
    log.info("job=%r batch=%d settings=%r", "j", 3, db)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("batch failed")
    logging.getLogger("alembic.runtime.migration").info("Running upgrade")  # quiet by default
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "txn_offsets.spark.runner"
    assert first["message"].startswith(
        "job='j' batch=3 settings=DatabaseSettings(url='postgresql+psycopg://u:***@db/x'"
    )
    assert first["ts"].endswith("+00:00")
    assert second["exc_type"] == "ValueError" and "boom" in second["exc"]
    assert "pw-secret-7" not in stream.getvalue()


def test_configure_is_idempotent_and_verbose_shows_libraries(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(logging.WARNING, fmt="text", stream=stream)
    configure_logging(logging.INFO, fmt="text", stream=stream, quiet_libraries=False)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_txn_offsets_handler", False)]
    assert len(ours) == 1
    logging.getLogger("alembic.runtime.migration").info("Running upgrade 0003 -> 0004")
    assert stream.getvalue().count("Running upgrade 0003 -> 0004") == 1


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "text"), ("", "text"), ("JSON", "json"), (" text ", "text")]
)
def test_log_format_from_env(value: str | None, expected: str) -> None:
    env = {} if value is None else {"TXN_OFFSETS_LOG_FORMAT": value}
    assert log_format_from_env(env) == expected


def test_unknown_log_format() -> None:
    with pytest.raises(ConfigError, match="TXN_OFFSETS_LOG_FORMAT: 'xml': use 'text' or 'json'"):
        log_format_from_env({"TXN_OFFSETS_LOG_FORMAT": "xml"})


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_plain_lines_off_a_terminal() -> None:
    stream = io.StringIO()
    with output.progress("import", total=3, stream=stream) as bar:
        bar.advance(note="read 4 offset(s) from t[0]")
        bar.advance()
    assert stream.getvalue().splitlines() == ["import: 1/3 read 4 offset(s) from t[0]", "import: 2/3"]


def test_progress_is_a_live_display_on_a_terminal() -> None:
    stream = Terminal()
    with output.progress("import", total=2, stream=stream) as bar:
        bar.advance(note="t[0] and [bold]markup[/bold] shown as text")
        bar.advance()
    assert "\x1b[" in stream.getvalue() or stream.getvalue() == ""  # rich drew (and cleared) it
    assert "import: 1/2" not in stream.getvalue()
