"""How the CLI prints: aligned tables, JSON documents, and progress for long work.

Progress goes to stderr: a live display (rich) when stderr is a terminal, else one plain line per
step, so scripts and CI logs stay readable and stdout stays the command's result alone.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Protocol, TextIO

from txn_offsets.admin.moves import Move, MovePlan
from txn_offsets.errors import JobAlreadyRunning

__all__ = ["Progress", "confirm_move", "emit_json", "print_moves", "printable", "progress", "table"]

FORMATS = ("table", "json")


# C0 and C1 control characters, DEL, the line and paragraph separators and the bidirectional
# overrides and isolates: text a tenant wrote (a job name, an audit reason) would otherwise move
# the terminal's cursor, recolour or clear it, break a row in two or reorder what it shows
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}")


def printable(text: str) -> str:
    """`text` with every control character shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``),
    so that a value a tenant wrote can neither drive the terminal nor forge rows; other text,
    backslashes included, is unchanged."""
    return _UNSAFE.sub(_escape, text)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, out: TextIO | None = None) -> None:
    """Columns padded to their widest cell; None prints as ``-``; control characters in any cell
    as escapes (:func:`printable`); JSON output (:func:`emit_json`) escapes them itself."""
    stream = out or sys.stdout
    cells = [
        [printable(str(c)) for c in header],
        *[["-" if c is None else printable(str(c)) for c in row] for row in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=stream)


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def emit_json(document: Any, *, out: TextIO | None = None) -> None:
    """One JSON document on stdout (datetimes as ISO 8601)."""
    print(json.dumps(document, default=_default, indent=2, sort_keys=False), file=out or sys.stdout)


class Progress(Protocol):
    def advance(self, step: int = 1, *, note: str = "") -> None: ...


class _Lines:
    """Plain progress lines for logs and pipes."""

    def __init__(self, label: str, total: int | None, stream: TextIO) -> None:
        self.label, self.total, self.stream, self.done = label, total, stream, 0

    def advance(self, step: int = 1, *, note: str = "") -> None:
        self.done += step
        of = f"/{self.total}" if self.total is not None else ""
        print(f"{self.label}: {self.done}{of}{f' {note}' if note else ''}", file=self.stream, flush=True)


class _Rich:
    def __init__(self, bar: Any, task: Any) -> None:
        self.bar, self.task = bar, task

    def advance(self, step: int = 1, *, note: str = "") -> None:
        self.bar.update(self.task, advance=step, description=note or None)


@contextmanager
def progress(label: str, total: int | None = None, *, stream: TextIO | None = None) -> Iterator[Progress]:
    """A progress display for `total` steps (None: unknown), live on a terminal, lines otherwise."""
    out = stream or sys.stderr
    if not out.isatty():
        yield _Lines(label, total, out)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    with RichProgress(
        # topic[partition] notes are not rich markup
        TextColumn(f"{label} {{task.description}}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=out),
        transient=True,
    ) as bar:
        yield _Rich(bar, bar.add_task("", total=total))


def print_moves(header: str, moves: Iterable[Move], *, detail: Callable[[Any], str] | None = None) -> None:
    """The plan of an offset move: one line per partition, old -> new (and the difference)."""
    print(header)
    for m in moves:
        old = "(none)" if m.old is None else str(m.old)
        delta = "" if m.old is None else f"  ({m.new - m.old:+d})"
        shown = printable(f"{m.topic}[{m.partition}]  {old} -> {m.new}{delta}{detail(m) if detail else ''}")
        print(f"  {shown}")


def confirm_move(plan: MovePlan, *, action: str, dry_run: bool, force: bool) -> bool:
    """After a printed plan: say whether a live run holds the lease; False for a dry run (nothing
    is changed); JobAlreadyRunning when a live run holds it and `force` was not given."""
    if plan.live_run is not None:
        run = printable(str(plan.live_run))
        if force:
            then = f"--force: the {action} would fence it" if dry_run else f"--force: the {action} fences it"
        else:
            then = f"the {action} {'would need' if dry_run else 'needs'} --force, which fences it"
        expires = "" if plan.lease_left_s is None else f", expires in {max(plan.lease_left_s, 0.0):.1f}s"
        seen = f"heartbeat {plan.heartbeat_age_s:.1f}s ago{expires}"
        print(f"note: live run {run} holds the lease ({seen}); {then}")
    if dry_run:
        print("dry run: nothing changed")
        return False
    if plan.live_run is not None and not force:
        raise JobAlreadyRunning(
            plan.job,
            plan.live_run,
            plan.generation or 0,
            plan.heartbeat_age_s,
            lease_left_s=plan.lease_left_s,
            lease_s=plan.lease_s,
        )
    return True
