"""The admin layer: plain functions that return data and never print.

The command line (:mod:`txn_offsets.cli`) and the HTTP service (:mod:`txn_offsets.service`) are
two thin front-ends over it, as alembic's CLI is over its ``command`` module.
"""
