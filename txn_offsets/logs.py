"""Logging setup for the CLI, the service and job drivers: plain text or JSON lines.

``configure_logging()`` installs one handler on the root logger. The format comes from the
argument, else ``TXN_OFFSETS_LOG_FORMAT`` (``text``, the default, or ``json``: one JSON object per
line with ``ts``, ``level``, ``logger``, ``message`` and, for a failure, ``exc_type`` and
``exc``). The library's log messages carry names, offsets and counts, never record payloads or
secrets (its settings render redacted), so JSON adds no new exposure: it only changes the framing.

alembic's and uvicorn's INFO chatter is kept at WARNING unless asked for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal, TextIO

from txn_offsets.errors import ConfigError

__all__ = ["FORMATS", "JsonFormatter", "configure_logging", "log_format_from_env", "logging_configured"]

FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# third-party loggers whose INFO lines repeat what our commands print themselves
_CHATTY = ("alembic", "uvicorn", "uvicorn.error", "uvicorn.access", "httpx")
_HANDLER_MARK = "_txn_offsets_handler"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; every value a string or number (no reprs of arbitrary objects)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def log_format_from_env(environ: dict[str, str] | None = None) -> LogFormat:
    """``TXN_OFFSETS_LOG_FORMAT`` (text or json; unset: text)."""
    env = os.environ if environ is None else environ
    value = (env.get("TXN_OFFSETS_LOG_FORMAT") or "text").strip().lower()
    if value == "json":
        return "json"
    if value == "text":
        return "text"
    raise ConfigError("TXN_OFFSETS_LOG_FORMAT", f"{value!r}: use 'text' or 'json'")


def configure_logging(
    level: int = logging.INFO,
    *,
    fmt: LogFormat | None = None,
    stream: TextIO | None = None,
    quiet_libraries: bool = True,
) -> logging.Handler:
    """Log `level` and above to `stream` (default stderr) as text or JSON lines; returns the handler.

    Idempotent: calling it again replaces the handler it installed before (never the handlers of
    the application). With `quiet_libraries` (default) third-party INFO chatter (alembic's
    migration steps, uvicorn's access lines) stays at WARNING unless `level` is DEBUG.
    """
    chosen = fmt or log_format_from_env()
    if chosen not in FORMATS:
        raise ConfigError("log format", f"{chosen!r}: use 'text' or 'json'")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _CHATTY:
        quiet = quiet_libraries and level > logging.DEBUG
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
    return handler


@contextlib.contextmanager
def logging_configured(
    level: int = logging.INFO, *, fmt: LogFormat | None = None, quiet_libraries: bool = True
) -> Iterator[logging.Handler]:
    """:func:`configure_logging` for the duration of a block, then the previous setup back (the CLI
    called in-process, e.g. by tests, leaves the application's logging as it found it)."""
    root = logging.getLogger()
    saved = (root.level, {name: logging.getLogger(name).level for name in _CHATTY})
    handler = configure_logging(level, fmt=fmt, quiet_libraries=quiet_libraries)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        for name, old in saved[1].items():
            logging.getLogger(name).setLevel(old)
