"""The alembic scripts of migrations/versions/ as modules, for tests that read their constants
(each script is a frozen file, not an importable module of the package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).resolve().parents[1] / "migrations" / "versions"


def load(revision: str) -> ModuleType:
    """The script of `revision` (e.g. "0014"), loaded as a module."""
    path = next(VERSIONS.glob(f"{revision}_*.py"))
    spec = importlib.util.spec_from_file_location(f"migration_{revision}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
