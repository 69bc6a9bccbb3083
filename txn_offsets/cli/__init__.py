"""The ``txn-offsets`` command line: the entry point (:mod:`~txn_offsets.cli.main`), one module per
command group (db, offsets, jobs, dev, serve) and :mod:`~txn_offsets.cli.output`. It parses and
prints; the plain functions behind it, usable without the command line, are in
:mod:`txn_offsets.admin`."""

from txn_offsets.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
