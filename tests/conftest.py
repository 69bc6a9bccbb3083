"""Test configuration: fixtures live in tests/fix_*.py; markers are added by path."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fix_services", "tests.fix_spark"]

_BY_DIR = {"unit": "unit", "integration": "integration", "spark": "spark", "chaos": "slow"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for directory, marker in _BY_DIR.items():
            if directory in parts:
                item.add_marker(getattr(pytest.mark, marker))
        if "spark" in parts:
            item.add_marker(pytest.mark.integration)
