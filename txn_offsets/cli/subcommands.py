"""Deprecated: the store's sub-commands are split by command group, :mod:`txn_offsets.cli.db`,
:mod:`txn_offsets.cli.offsets` and :mod:`txn_offsets.cli.jobs`.

Kept for one release so that old imports still work; importing it warns.
"""

from __future__ import annotations

import argparse
import warnings

from txn_offsets.cli import db, jobs, offsets

__all__ = ["register"]

warnings.warn(
    "txn_offsets.cli.subcommands is deprecated: import the command groups from txn_offsets.cli.db, "
    "txn_offsets.cli.offsets and txn_offsets.cli.jobs",
    DeprecationWarning,
    stacklevel=2,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``db``, ``offsets`` and ``jobs`` sub-commands to the CLI parser."""
    for group in (db, offsets, jobs):
        group.register(sub)
