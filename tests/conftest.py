"""Test configuration: fixtures live in tests/fix_*.py; markers are added by path.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile --no-loadscope-reorder``,
in the order collected here, not xdist's by number of tests): a test file is one
unit (its tests run in order on one worker, its module fixtures are built once), and the files that
take minutes (the chaos and bench smokes, the Structured Streaming kill test, the standalone
cluster...) are handed out first, so neither worker is left with one of them at the end while the
other waits. Each worker has its own Spark session; each test has its own schema, job and topics
(uuid names), so tests on the two workers never share state."""

from __future__ import annotations

import os

import pytest

from tests import jvm_archive

#: every JVM the tests start (Spark drivers, Connect servers, standalone masters and workers, the
#: README's private Kafka) compiles with C1 only: they live seconds to minutes on small data, where
#: C2's compiler threads cost more CPU than they give back on two shared cores (2026-11-28, a
#: local[2] session: 22 s -> 14 s of JVM CPU to start, five small jobs 23 s -> 13 s). The JIT tier
#: changes no result; the broker `make stack-up` starts before pytest keeps the JVM's defaults, and
#: `make bench` measures with them. And a class-data archive of pyspark's jars when one exists
#: (tests/jvm_archive.py: ~5 s less CPU per Spark JVM)
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def _with_test_jvm_options(current: str) -> str:
    extra = [o for o in (TEST_JVM_OPTIONS, *jvm_archive.options().split()) if o not in current.split()]
    return " ".join([current, *extra]).strip()


os.environ["JAVA_TOOL_OPTIONS"] = _with_test_jvm_options(os.environ.get("JAVA_TOOL_OPTIONS", ""))

pytest_plugins = ["tests.fix_services", "tests.fix_spark", "tests.fix_wheel"]

_BY_DIR = {"unit": "unit", "integration": "integration", "spark": "spark", "chaos": "slow"}
#: the files that take a minute or more, longest first (``make test --durations`` lists them): they
#: are scheduled before the rest, so the short files fill the end of both workers' runs
_LONG_FILES = (
    "test_readme.py",  # a wheel installed into a fresh venv, a private stack, the README's jobs
    "test_chaos_smoke.py",
    "test_bench_smoke.py",
    "test_streaming_kills.py",
    "test_standalone_cluster.py",
    "test_pgbouncer_concurrency.py",
    "test_import_sss.py",
    "test_streaming.py",
    "test_connect.py",
    "test_demo_smoke.py",
    "test_signals.py",
    "test_fenced_by.py",
    "test_crash_restart.py",
    "test_tls_sasl.py",
    "test_wheel_install.py",  # the wheel test_readme.py built (or builds: one install per run)
)


def _first(item: pytest.Item) -> int:
    name = item.path.name
    return _LONG_FILES.index(name) if name in _LONG_FILES else len(_LONG_FILES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for directory, marker in _BY_DIR.items():
            if directory in parts:
                item.add_marker(getattr(pytest.mark, marker))
        if "spark" in parts:
            item.add_marker(pytest.mark.integration)
    items.sort(key=_first)  # stable: the order inside a file, and of the other files, stays
