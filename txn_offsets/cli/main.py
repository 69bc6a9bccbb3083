"""The `txn-offsets` command line: a thin layer over plain functions.

One module per command group (:mod:`~txn_offsets.cli.db`, :mod:`~txn_offsets.cli.offsets`,
:mod:`~txn_offsets.cli.jobs`, :mod:`~txn_offsets.cli.dev`, :mod:`~txn_offsets.cli.serve`) parses
and prints; the work is done by :mod:`txn_offsets.admin` and the store, Kafka and devstack packages.

The contract (docs/store.md, "Exit codes"): the library's own errors print as one line and exit
with code 1 (`--debug` shows the traceback); a wrong command line is one line and code 64; a check
that says no (`offsets lag --fail-over`) is code 3. Anything else is a bug and keeps its traceback.
The global flags (`--debug`, `-v`, `--format`) are accepted before or after the command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from txn_offsets._version import __version__
from txn_offsets.cli import db, dev, exits, jobs, offsets, serve
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured

Handler = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's usage errors: one line on stderr, exit code 64 (not argparse's 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"txn-offsets: error: {message} (see `{self.prog} --help`)\n")


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--debug and -v on the top parser and on every command: a command's copy has no default, so
    leaving it out keeps what was given before the command."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--debug", action="store_true", default=default(False), help="show tracebacks and debug logs"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="show INFO logs (default: warnings and errors only)",
    )


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command and sub-command parser below `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield child
                yield from _commands(child)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="txn-offsets", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"txn-offsets {__version__}")
    _global_flags(parser, top=True)
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help="table or json, for the commands that print rows (offsets show|lag|history, jobs list)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # the order of `txn-offsets --help`
    for group in (dev, db, offsets, jobs, serve):
        group.register(sub)
    for command in _commands(parser):
        _global_flags(command, top=False)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if getattr(args, "takes_format", False):
        args.format = getattr(args, "format", "table")
    elif hasattr(args, "format"):
        command = " ".join(a for a in (args.command, *_sub_commands(args)) if a)
        parser.error(
            f"--format: `{command}` prints no rows; --format goes with offsets show|lag|history and jobs list"
        )
    return args


def _sub_commands(args: argparse.Namespace) -> list[str]:
    return [v for k, v in vars(args).items() if k.endswith("_command") and isinstance(v, str)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as done:  # --help, --version (0) and usage errors (64)
        return done.code if isinstance(done.code, int) else exits.USAGE
    handler: Handler = args.handler
    try:
        # the commands print their own results: logs are for warnings unless asked for
        # (TXN_OFFSETS_LOG_FORMAT=json gives JSON lines)
        level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
        with logging_configured(level, quiet_libraries=not (args.debug or args.verbose)):
            return handler(args)
    except TxnOffsetsError as exc:
        if args.debug:
            raise
        print(f"txn-offsets: error: {exc}", file=sys.stderr)
        return exits.ERROR
