"""Every `txn-offsets ...` command line in README.md and docs/*.md parses with the real CLI parser.

Command lines are taken from fenced code blocks (a line starting with `txn-offsets`, or `$ txn-offsets`,
with its indented continuation lines) and from inline code spans (`` `txn-offsets ...` ``, which may
wrap). Synopsis notation is expanded before parsing: `[...]` is included, `(a | b)` and `a|b` give one
command line per alternative, `...` inside brackets repeats (dropped), and placeholders get a value of
their type (`N` a number, `ISO8601` a date). A line that names only a command (`txn-offsets offsets
reset`, no options) or elides part of itself with a bare `...` may leave required arguments out; any
other error is a usage error of the doc and fails the test, naming the doc, the line and the error.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# the module, not txn_offsets.cli.main the function that txn_offsets.cli re-exports
cli_main = importlib.import_module("txn_offsets.cli.main")

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# placeholders whose value must parse as something other than a plain string
PLACEHOLDERS = {
    "N": "7",
    "P": "0",
    "O": "7",
    "ID": "1",
    "ISO8601": "2024-05-01T00:00:00Z",
    "REVISION": "head",
    "T,P,O": "topic,partition,offset",
    "COL=VAL": "app=j",
    "SCHEMA.TABLE": "legacy.kafka_offsets",
    "HOST:PORT": "127.0.0.1:9092",
    "DUR": "30d",
}
SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>&1"}


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str  # as written, `txn-offsets` included
    in_code_block: bool

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _code_block_commands(doc: str, lines: list[str]) -> Iterator[DocCommand]:
    fenced = False
    current: list[str] = []
    start = 0
    for number, raw in enumerate(lines, 1):
        if raw.lstrip().startswith("```"):
            if current:
                yield DocCommand(doc, start, " ".join(current), True)
                current = []
            fenced = not fenced
            continue
        if not fenced:
            continue
        line = raw.strip().removeprefix("$ ")
        if line.startswith("txn-offsets"):
            if current:
                yield DocCommand(doc, start, " ".join(current), True)
            current, start = [line], number
        elif current and raw[:1].isspace() and line and not line.startswith("#"):
            current.append(line)  # a continuation of a synopsis
        elif current and not (raw[:1].isspace() and line.startswith("#")):
            yield DocCommand(doc, start, " ".join(current), True)
            current = []
    if current:
        yield DocCommand(doc, start, " ".join(current), True)


def _inline_commands(doc: str, lines: list[str]) -> Iterator[DocCommand]:
    prose: list[str] = []
    fenced = False
    for raw in lines:  # code blocks blanked, line numbers kept
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            prose.append("")
        else:
            prose.append("" if fenced else raw)
    text = "\n".join(prose)
    for match in re.finditer(r"(?<!`)`(txn-offsets(?=[\s`])[^`]*)`", text):
        number = text.count("\n", 0, match.start()) + 1
        yield DocCommand(doc, number, " ".join(match.group(1).split()), False)


def doc_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        name = str(path.relative_to(REPO))
        found += _code_block_commands(name, lines)
        found += _inline_commands(name, lines)
    return found


# -- synopsis notation -> concrete argument lists


def _tokens(text: str) -> list[str]:
    spaced = re.sub(r"([\[\]()])", r" \1 ", text)
    return shlex.split(spaced, comments=True)


def _group(tokens: list[str], pos: int, close: str) -> tuple[list[list[list[str]]], int]:
    """Alternatives (each a list of expanded variants) up to `close`; returns them and the position."""
    alternatives: list[list[list[str]]] = []
    variants: list[list[str]] = [[]]
    while pos < len(tokens):
        token = tokens[pos]
        if token == close:
            return [*alternatives, variants], pos + 1
        if token == "|" and close:
            alternatives.append(variants)
            variants = [[]]
            pos += 1
            continue
        if token in ("[", "("):
            inner, pos = _group(tokens, pos + 1, "]" if token == "[" else ")")
            options = [v for alternative in inner for v in alternative]
        else:
            pos += 1
            if token == "..." and close:
                continue  # repeatable
            words = (
                [w for w in token.split("|") if w] if re.fullmatch(r"[\w-]+(\|[\w-]+)+", token) else [token]
            )
            options = [[PLACEHOLDERS.get(w, w)] for w in words]
        variants = [v + o for v, o in itertools.product(variants, options)]
    assert not close, f"unbalanced {close!r}"
    return [*alternatives, variants], pos


def expand(text: str) -> tuple[list[list[str]], bool]:
    """The concrete argument lists of a doc command line (without `txn-offsets`), and whether the line
    elides part of itself (a bare `...`)."""
    tokens = _tokens(text)
    assert tokens[0] == "txn-offsets", text
    tokens, depth = tokens[1:], 0
    for i, token in enumerate(tokens):
        depth += (token in ("[", "(")) - (token in ("]", ")"))
        if depth == 0 and (token in SHELL_ENDS or re.match(r"\d?>", token)):
            tokens = tokens[:i]
            break
    elided = "..." in _top_level(tokens)
    if elided:
        if tokens[-1] == "..." and tokens[-2].startswith("--"):
            tokens[-1] = "x"  # `--reason ...` elides a value
        tokens = [t for t in tokens if t != "..."]  # `reset ... --to-offset` elides options
    tokens = [re.sub(r"^<[^>]*>$", "7", t) for t in tokens]
    (variants,), _ = _group(tokens, 0, "")
    return variants, elided


def _top_level(tokens: list[str]) -> list[str]:
    depth, top = 0, []
    for token in tokens:
        depth += token in ("[", "(")
        depth -= token in ("]", ")")
        if depth == 0:
            top.append(token)
    return top


def parse_error(argv: list[str]) -> str | None:
    """What the real parser says about `argv` (None: it parses)."""
    parser = cli_main.build_parser()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main._parse(parser, argv)
        except SystemExit as done:
            if done.code not in (0, None):
                return err.getvalue().strip() or f"exit {done.code}"
    return None


COMMANDS = doc_commands()


def test_the_docs_have_command_lines() -> None:
    # a scan that silently finds nothing checks nothing
    assert len(COMMANDS) > 60
    texts = {c.text.split("#")[0].strip() for c in COMMANDS}
    assert "txn-offsets db upgrade" in texts
    assert any(c.doc == "docs/store.md" and "(--to-earliest" in c.text for c in COMMANDS)


@pytest.mark.parametrize(
    "text",
    [
        "txn-offsets offsets lag --job J --fail-over -5",
        "txn-offsets offsets reset --job J --to-nowhere --reason r",
        "txn-offsets db upgrad",
        "txn-offsets serve --format json",
        "txn-offsets offsets history --job J [--limit N] [--format table|xml]",
    ],
)
def test_a_wrong_command_line_is_caught(text: str) -> None:
    variants, _ = expand(text)
    assert any(parse_error(argv) for argv in variants), text


def test_synopsis_notation_expands() -> None:
    variants, elided = expand(
        "txn-offsets offsets reset --job J (--to-earliest | --to-offset N) [--partition P ...]"
    )
    assert not elided
    assert variants == [
        ["offsets", "reset", "--job", "J", "--to-earliest", "--partition", "0"],
        ["offsets", "reset", "--job", "J", "--to-offset", "7", "--partition", "0"],
    ]
    assert expand("txn-offsets dev up|down") == ([["dev", "up"], ["dev", "down"]], False)
    assert expand("txn-offsets db grants --role r | psql -d app") == (
        [["db", "grants", "--role", "r"]],
        False,
    )
    assert expand("txn-offsets offsets reset ... --to-offset <offset+1>")[1]


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_documented_command_line_parses(command: DocCommand) -> None:
    variants, elided = expand(command.text)
    options = any(t.startswith("-") for v in variants for t in v)
    # a mention of a command (`txn-offsets offsets reset`) or an elided line may leave required
    # arguments out; nothing else may fail
    partial = elided or (not command.in_code_block and not options)
    for argv in variants:
        error = parse_error(argv)
        if error is None or (partial and "the following arguments are required" in error):
            continue
        pytest.fail(f"{command}\n  as {' '.join(argv)!r}: {error}")
