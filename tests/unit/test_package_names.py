"""The package's public names are imported when first looked up (PEP 562), not by ``import
txn_offsets``: a fresh process that imports the package, or any submodule of it (the ``txn-offsets``
command, a Spark Python worker, the Structured Streaming source's runner), no longer pays for Spark's
runner, the planner, SQLAlchemy, psycopg and librdkafka before anything asks for them."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import txn_offsets
import txn_offsets.errors as txn_offsets_errors
from tests.fix_services import REPO

HEAVY = ("sqlalchemy", "psycopg", "confluent_kafka", "pyspark", "alembic", "txn_offsets.spark.runner")


def _loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_import_txn_offsets_loads_none_of_the_heavy_modules() -> None:
    assert _loaded_after("import txn_offsets; txn_offsets.__version__") == set()


def test_a_name_loads_its_own_module() -> None:
    loaded = _loaded_after("from txn_offsets import OffsetRange, TxnOffsetsError")
    assert "txn_offsets.spark.runner" not in loaded
    assert "pyspark" not in loaded
    assert "txn_offsets.spark.runner" in _loaded_after("from txn_offsets import run_job")


@pytest.mark.parametrize("name", sorted(txn_offsets._MODULES))
def test_every_lazy_name_is_its_module_object(name: str) -> None:
    value = getattr(txn_offsets, name)
    home = importlib.import_module(txn_offsets._MODULES[name])
    assert value is getattr(home, name)
    assert name in dir(txn_offsets)


def test_every_public_name_is_lazy_or_an_error_class_imported_with_the_package() -> None:
    errors = {n for n in txn_offsets.__all__ if hasattr(txn_offsets_errors, n)}
    assert all(issubclass(getattr(txn_offsets_errors, n), Exception) for n in errors)
    assert errors <= set(vars(txn_offsets))  # bound by the package's own import
    assert set(txn_offsets._MODULES) == set(txn_offsets.__all__) - errors - {"__version__"}


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'run_jobs_typo'"):
        _ = txn_offsets.run_jobs_typo
