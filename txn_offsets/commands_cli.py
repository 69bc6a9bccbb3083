"""Sub-commands of the CLI that work on the offset store (db, offsets, jobs)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the store's sub-commands to the CLI parser."""
    del sub
