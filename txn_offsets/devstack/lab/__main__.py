"""`python -m txn_offsets.devstack.lab up|down|status`: ``make lab-up`` / ``lab-down`` / ``lab-status``
and ``txn-offsets dev up|down|status --lab``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from txn_offsets.devstack.lab import Lab
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.logs import logging_configured

__all__ = ["main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    """The outcome on stdout; an error as one line (exit 1); ``status`` exits 3 when something is down."""
    parser = argparse.ArgumentParser(prog="python -m txn_offsets.devstack.lab")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--lab-dir",
        default=".lab",
        help="where the lab keeps its files, logs and settings (default: ./.lab)",
    )
    args = parser.parse_args(argv)
    return run(args.action, Path(args.lab_dir))


def run(action: str, lab_dir: Path) -> int:
    """Do `action` (up, down, status) on the lab in `lab_dir` (also ``txn-offsets dev up --lab``)."""
    lab = Lab(lab_dir)
    try:
        with logging_configured(logging.WARNING, quiet_libraries=True):
            if action == "up":
                up = lab.up()
                print(
                    f"lab up in {up.seconds:.1f} s: kafka-1..3 (KRaft, replication 3, ISR 3), pg-1 primary + "
                    f"pg-2 streaming replica + pgbouncer, spark-master + workers {', '.join(up.workers)}; "
                    f"settings in {up.env_file}"
                )
            elif action == "down":
                count = lab.down()
                print(f"lab down: {count} namespaces removed; nothing named {lab.net.prefix}* is left")
            else:
                lines, ok = lab.status()
                print("\n".join(lines))
                return 0 if ok else 3
    except TxnOffsetsError as exc:
        print(f"txn-offsets: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
