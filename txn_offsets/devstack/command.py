"""The ``dev`` command: bring the local stack up, down, or say how it stands.

One command with two doors: ``txn-offsets dev ...`` (:mod:`txn_offsets.cli.dev`) and
``python -m txn_offsets.devstack ...`` (:mod:`txn_offsets.devstack.__main__`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from txn_offsets.devstack import POOLERS, Stack
from txn_offsets.errors import StackError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--stack-dir",
        default=os.environ.get("TXN_OFFSETS_STACK_DIR", ".stack"),
        help="where the stack keeps its data, logs and pid files (default: ./.stack)",
    )
    parser.add_argument(
        "--pooler",
        choices=POOLERS,
        default=os.environ.get("TXN_OFFSETS_POOLER") or None,
        help="up: also start this connection pooler in front of PostgreSQL (pgbouncer: transaction "
        "pooling, a pool of 2; its URL is TXN_OFFSETS_POOLED_DATABASE_URL in the settings file)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("TXN_OFFSETS_TLS", "") not in ("", "0"),
        help="up: PostgreSQL with ssl on and a Kafka SASL_SSL listener (SCRAM-SHA-512) with a throwaway "
        "CA; TXN_OFFSETS_TLS_* in the settings file (stays on for later starts)",
    )
    parser.add_argument(
        "--replica",
        action="store_true",
        default=os.environ.get("TXN_OFFSETS_REPLICA", "") not in ("", "0"),
        help="up: also start a streaming replica (hot standby) of PostgreSQL; its URL is "
        "TXN_OFFSETS_REPLICA_DATABASE_URL, the multi-host URL over both TXN_OFFSETS_HA_DATABASE_URL",
    )
    parser.add_argument(
        "--lab",
        action="store_true",
        help="the production-shaped lab instead (root: 3 Kafka brokers, PostgreSQL + replica, Spark "
        "master + 2 workers, each host a network namespace; docs/operations.md#the-lab)",
    )
    parser.add_argument("--lab-dir", default=".lab", help="--lab: its files and settings (default: ./.lab)")


def run(args: argparse.Namespace) -> int:
    """Do `args.action` and print the outcome; exit code 3 when ``status`` finds a service down."""
    if args.lab:
        from txn_offsets.devstack.lab.__main__ import run as on_the_lab

        return on_the_lab(args.action, Path(args.lab_dir))
    stack = Stack(Path(args.stack_dir))
    if args.action == "status" and not (stack.dir / "state.json").is_file():
        # status creates nothing: not the directory of a typo, not fresh ports and passwords
        where = "the directory does not exist" if not stack.dir.exists() else "it holds no state.json"
        raise StackError(
            "stack",
            f"no stack in {stack.dir} ({where})",
            "check --stack-dir (or $TXN_OFFSETS_STACK_DIR), or start one with `txn-offsets dev up`",
        )
    if args.action == "up":
        st = stack.up(pooler=args.pooler, replica=args.replica, tls_on=args.tls)
        pooled = f", pgbouncer pid {st.pgbouncer_pid} port {st.pgbouncer_port}" if st.pgbouncer_pid else ""
        pooled += (
            f", TLS: postgres ssl on, kafka SASL_SSL port {st.kafka_sasl_port}" if st.kafka_sasl_port else ""
        )
        pooled += f", replica pid {st.replica_pid} port {st.replica_port}" if st.replica_pid else ""
        print(
            f"stack up: postgres pid {st.postgres_pid} port {st.postgres_port}, "
            f"kafka pid {st.kafka_pid} port {st.kafka_port}{pooled}; settings in {st.env_file}"
        )
    elif args.action == "down":
        stopped = stack.down()
        print(f"stack down: stopped {', '.join(stopped) if stopped else 'nothing (not running)'}")
    else:
        st = stack.status()
        services = [("postgres", st.postgres_pid, st.postgres_port), ("kafka", st.kafka_pid, st.kafka_port)]
        if st.pgbouncer_port is not None:  # started with --pooler once: reported (and required) since
            services.append(("pgbouncer", st.pgbouncer_pid, st.pgbouncer_port))
        if st.replica_port is not None:  # started with --replica once: reported (and required) since
            services.append(("replica", st.replica_pid, st.replica_port))
        for name, pid, port in services:
            state = f"running (pid {pid})" if pid else "stopped"
            stale = f" (stale pid file {st.stale[name]}: its process is gone)" if name in st.stale else ""
            print(f"{name:9} {state:22} 127.0.0.1:{port}{stale}")
        return 0 if all(pid for _, pid, _ in services) else 3
    return 0
