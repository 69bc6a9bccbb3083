"""The ``txn-offsets`` command line: the entry point (:mod:`~txn_offsets.cli.main`), its
subcommands (:mod:`~txn_offsets.cli.subcommands`) and the plain functions behind them
(:mod:`~txn_offsets.cli.commands`), usable without the command line."""

from txn_offsets.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
