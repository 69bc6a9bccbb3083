"""The `txn-offsets` command line: a thin layer over plain functions.

Only the library's own errors are caught: they print as one line and exit with code 1
(`--debug` shows the traceback). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured

Handler = Callable[[argparse.Namespace], int]


def _dev(args: argparse.Namespace) -> int:
    from txn_offsets.devstack import Stack

    stack = Stack(Path(args.stack_dir))
    if args.action == "up":
        st = stack.up()
        print(
            f"stack up: postgres pid {st.postgres_pid} port {st.postgres_port}, "
            f"kafka pid {st.kafka_pid} port {st.kafka_port}; settings in {st.env_file}"
        )
    elif args.action == "down":
        stopped = stack.down()
        print(f"stack down: stopped {', '.join(stopped) if stopped else 'nothing (not running)'}")
    else:
        st = stack.status()
        for name, pid, port in (
            ("postgres", st.postgres_pid, st.postgres_port),
            ("kafka", st.kafka_pid, st.kafka_port),
        ):
            state = f"running (pid {pid})" if pid else "stopped"
            print(f"{name:9} {state:22} 127.0.0.1:{port}")
        return 0 if st.postgres_pid and st.kafka_pid else 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txn-offsets", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show INFO logs (default: warnings and errors only)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the embedded local stack (PostgreSQL + Kafka on loopback)")
    dev.add_argument("action", choices=["up", "down", "status"])
    dev.add_argument(
        "--stack-dir",
        default=os.environ.get("TXN_OFFSETS_STACK_DIR", ".stack"),
        help="where the stack keeps its data, logs and pid files (default: ./.stack)",
    )
    dev.set_defaults(handler=_dev)

    from txn_offsets.cli import serve, subcommands

    subcommands.register(sub)
    serve.register(sub)
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
