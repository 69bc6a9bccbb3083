"""The admin layer: what an operator does, as plain functions that return data and never print.

The command line (:mod:`txn_offsets.cli`) and the HTTP service (:mod:`txn_offsets.service`) are
two thin front-ends over it, as alembic's CLI is over its ``command`` module:
:mod:`~txn_offsets.admin.views` (stored offsets, jobs, audit history), :mod:`~txn_offsets.admin.lag`,
:mod:`~txn_offsets.admin.reset` and :mod:`~txn_offsets.admin.imports` (offset moves, one shape:
:mod:`~txn_offsets.admin.moves`), :mod:`~txn_offsets.admin.sources` and
:mod:`~txn_offsets.admin.checkpoint` (where an import reads offsets).
"""
