"""``txn-offsets dev up|down|status``: the embedded local stack, through
:mod:`txn_offsets.devstack.command` (also ``python -m txn_offsets.devstack``)."""

from __future__ import annotations

import argparse

from txn_offsets.devstack import command

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="the embedded local stack (PostgreSQL + Kafka on loopback)")
    command.add_arguments(dev)
    dev.set_defaults(handler=command.run)
