"""`python -m txn_offsets.devstack up|down|status` (also available as `txn-offsets dev ...`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from txn_offsets.devstack import command
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured


def main(argv: Sequence[str] | None = None) -> int:
    """As `txn-offsets dev`: the results on stdout, the library's errors as one line (exit code 1)."""
    parser = argparse.ArgumentParser(prog="txn-offsets dev")
    command.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        with logging_configured(logging.WARNING, quiet_libraries=True):
            return command.run(args)
    except TxnOffsetsError as exc:
        print(f"txn-offsets: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
