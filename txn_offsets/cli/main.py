"""The `txn-offsets` command line: a thin layer over plain functions.

One module per command group (:mod:`~txn_offsets.cli.db`, :mod:`~txn_offsets.cli.offsets`,
:mod:`~txn_offsets.cli.jobs`, :mod:`~txn_offsets.cli.dev`, :mod:`~txn_offsets.cli.serve`) parses
and prints; the work is done by :mod:`txn_offsets.admin` and the store, Kafka and devstack packages.

Only the library's own errors are caught: they print as one line and exit with code 1
(`--debug` shows the traceback). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from txn_offsets.cli import db, dev, jobs, offsets, serve
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txn-offsets", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show INFO logs (default: warnings and errors only)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # the order of `txn-offsets --help`
    for group in (dev, db, offsets, jobs, serve):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        return 1
