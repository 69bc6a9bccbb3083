"""The `txn-offsets` command line: a thin layer over plain functions.

One module per command group (:mod:`~txn_offsets.cli.db`, :mod:`~txn_offsets.cli.offsets`,
:mod:`~txn_offsets.cli.jobs`, :mod:`~txn_offsets.cli.dev`, :mod:`~txn_offsets.cli.serve`) parses
and prints; the work is done by :mod:`txn_offsets.admin` and the store, Kafka and devstack packages.

The contract (docs/store.md, "Exit codes"): the library's own errors print as one line and exit
with code 1 (`--debug` shows the traceback); a wrong command line is one line and code 64, and it
echoes no value that could be a secret (:func:`unechoed`); a check that says no (`offsets lag
--fail-over`) is code 3; Ctrl-C is one line and code 130; a stdout closed by its reader (`| head`)
ends quietly with code 141, as git and coreutils do. Anything else is a bug and keeps its
traceback. The global flags (`--debug`, `-v`, `--format`) are accepted before or after the command.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from txn_offsets._version import __version__
from txn_offsets.cli import db, dev, exits, jobs, offsets, serve
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured

Handler = Callable[[argparse.Namespace], int]


_UNRECOGNIZED = "unrecognized arguments: "
# what could hold a secret in a value argparse would echo: a URL past its scheme (user:password@,
# ?password=), a user:password@host without one, a key=value whose key names a secret
_URL = re.compile(r"\b([A-Za-z][\w+.-]*://)[^\s'\"]*")
_USERINFO = re.compile(r"[^\s'\"/@]+@")
_SECRET_PAIR = re.compile(r"(?i)\b([\w.-]*(?:password|passwd|secret|token|key)[\w.-]*\s*=\s*)[^\s'\"]+")
_URL_OPTION = re.compile(r"(?i)url|dsn|database|password")


def unechoed(message: str) -> str:
    """An argparse error message that echoes no value that could be a secret: unrecognized
    arguments by their option names only (``--database-url=URL`` and ``--database-url URL`` as
    ``--database-url``; bare values not at all), and in any other message a URL as its scheme
    alone, ``user:password@`` and ``password=...`` masked."""
    if message.startswith(_UNRECOGNIZED):
        # argparse joined the tokens with spaces: the option names are what can be told apart
        tokens = message[len(_UNRECOGNIZED) :].split()
        names = [t.split("=", 1)[0] for t in tokens if t.startswith("-")]
        valued = len(names) < len(tokens) or any("=" in t for t in tokens if t.startswith("-"))
        shown = " ".join(names) + (" and values (not echoed)" if valued else "")
        hint = (
            "; the database URL is read from $TXN_OFFSETS_DATABASE_URL only, never from an argument"
            if any(_URL_OPTION.search(n) for n in names)
            else ""
        )
        if not names:
            return "unrecognized arguments (their values are not echoed)"
        return f"{_UNRECOGNIZED}{shown}{hint}"
    masked = _URL.sub(r"\1***", message)
    masked = _USERINFO.sub("***@", masked)
    return _SECRET_PAIR.sub(r"\1***", masked)


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's usage errors: one line on stderr, exit code 64 (not argparse's 2),
    no value that could be a secret echoed (:func:`unechoed`)."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"txn-offsets: error: {unechoed(message)} (see `{self.prog} --help`)\n")


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


def _row_commands(parser: argparse.ArgumentParser) -> str:
    """The commands that print rows (they take ``--format``), as ``offsets show|lag, jobs list``."""
    groups: dict[str, list[str]] = {}
    for command in _commands(parser):
        if command.get_default("takes_format"):
            *group, name = command.prog.split()[1:]
            groups.setdefault(" ".join(group), []).append(name)
    return ", ".join(f"{group} {'|'.join(names)}".strip() for group, names in groups.items())


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="txn-offsets", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"txn-offsets {__version__}")
    _global_flags(parser, top=True)
    fmt = parser.add_argument("--format", choices=("table", "json"), default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    # the order of `txn-offsets --help`
    for group in (dev, db, offsets, jobs, serve):
        group.register(sub)
    for command in _commands(parser):
        _global_flags(command, top=False)
    fmt.help = f"table or json, for the commands that print rows ({_row_commands(parser)})"
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if getattr(args, "takes_format", False):
        args.format = getattr(args, "format", "table")
    elif hasattr(args, "format"):
        command = " ".join(a for a in (args.command, *_sub_commands(args)) if a)
        parser.error(f"--format: `{command}` prints no rows; --format goes with {_row_commands(parser)}")
    return args


def _sub_commands(args: argparse.Namespace) -> list[str]:
    return [v for k, v in vars(args).items() if k.endswith("_command") and isinstance(v, str)]


def _help_of(args: argparse.Namespace) -> str:
    """The ``--help`` to read for a usage error of the command `args` ran."""
    return " ".join(["txn-offsets", args.command, *_sub_commands(args), "--help"])


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so that the interpreter's last flush
    of what is left in its buffer cannot fail again (and print "Exception ignored")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's capture): nothing will flush it
        pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed stdout fails here, not in the interpreter's last flush
        return code
    except KeyboardInterrupt:
        # psycopg cancels the statement in flight; the server rolls back what no COMMIT reached
        print(
            "txn-offsets: interrupted (Ctrl-C); any transaction it had open was rolled back", file=sys.stderr
        )
        return exits.INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return exits.CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
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
    except exits.UsageError as exc:
        print(f"txn-offsets: error: {unechoed(str(exc))} (see `{_help_of(args)}`)", file=sys.stderr)
        return exits.USAGE
    except TxnOffsetsError as exc:
        if args.debug:
            raise
        print(f"txn-offsets: error: {exc}", file=sys.stderr)
        return exits.ERROR
