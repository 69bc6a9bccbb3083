"""Test configuration: fixtures live in tests/fix_*.py; markers are added by path.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadgroup``): every test that
drives Spark (under integration/spark/, or asking for a Spark session, or the chaos and bench smokes
that run jobs in processes of their own) is in ONE group, so one worker runs them one after another
as before, while the other worker takes the rest file by file (a file is a group: its tests keep
their order and module fixtures). Each test has its own schema, job and topics (uuid names)."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fix_services", "tests.fix_spark"]

_BY_DIR = {"unit": "unit", "integration": "integration", "spark": "spark", "chaos": "slow"}
#: the tests outside integration/spark/ that run Spark jobs in processes of their own, and those that
#: delete and re-create topics under load (a Spark test's re-created topic then waited on Kafka's
#: controller long enough to read a log that was not re-created yet)
_SPARK_BOUND_FILES = {
    "test_chaos_smoke.py",
    "test_bench_leftovers.py",
    "test_pgbouncer_concurrency.py",
    "test_admin_clients.py",
    "test_recreated_topics.py",
    "test_metadata_scale.py",
}
_SPARK_FIXTURES = {"spark", "connect_spark"}


def _group(item: pytest.Item) -> str:
    parts = item.path.parts
    fixtures = set(getattr(item, "fixturenames", ()))
    if "spark" in parts or fixtures & _SPARK_FIXTURES or item.path.name in _SPARK_BOUND_FILES:
        return "spark"
    return item.path.as_posix()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for directory, marker in _BY_DIR.items():
            if directory in parts:
                item.add_marker(getattr(pytest.mark, marker))
        if "spark" in parts:
            item.add_marker(pytest.mark.integration)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
