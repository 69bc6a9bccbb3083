"""The packages of the wheel: what pyproject.toml cannot say (its metadata and package data are there).

Every ``txn_offsets*`` package of the tree, plus ``txn_offsets.migrations`` (and its ``versions``)
built from the top-level ``migrations/``, the alembic environment beside ``alembic.ini``: a wheel
install runs ``txn-offsets db upgrade`` with no checkout, and txn_offsets.store.migrate finds the
scripts in either place. setuptools' package discovery in pyproject.toml cannot map a folder from
outside the package into it, so the list is built here.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["txn_offsets*"], exclude=["txn_offsets.migrations*"]),
        "txn_offsets.migrations",
        "txn_offsets.migrations.versions",
    ],
    package_dir={"txn_offsets.migrations": "migrations"},
)
