"""``make test``'s two workers: each test file runs whole on one worker, the long files first.

pytest-xdist's ``--dist loadgroup`` was silently dealing out single tests on pytest 9 (xdist 3.8 tags
the node id, which pytest 9 no longer reads from ``_nodeid``): a file's module fixtures were built on
both workers and its tests interleaved with other files'. These tests run a small suite with the
Makefile's own ``TEST_WORKERS`` and check where each test ran."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests import jvm_archive
from tests.conftest import (
    _LONG_FILES,
    TEST_JVM_OPTIONS,
    _with_test_jvm_options,
    pytest_collection_modifyitems,
)

REPO = Path(__file__).resolve().parents[2]


def _test_workers() -> list[str]:
    match = re.search(r"^TEST_WORKERS \?= (.*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile lost TEST_WORKERS"
    return shlex.split(match.group(1))


def test_each_file_runs_whole_on_one_worker_in_the_collected_order(tmp_path: Path) -> None:
    """test_a.py (one test, collected first, as the long files are) is the first file its worker
    runs: xdist's default orders files by their number of tests, which left make test's one-test
    chaos and bench smokes to the end of the run, behind the big files. (Asserted per worker, not
    by start time across workers: a worker that boots late under load runs its first file late.)"""
    log = tmp_path / "started.log"
    for name, tests in (("test_a.py", 1), ("test_b.py", 12), ("test_c.py", 12)):
        body = "".join(
            f"import os\n\ndef test_{i}():\n    with open({str(log)!r}, 'a') as f:\n"
            f"        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + {name!r} + '\\n')\n\n"
            for i in range(tests)
        )
        (tmp_path / name).write_text(body)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *_test_workers(), str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, file in re.findall(r"^\[(gw\d+)\] .*PASSED (test_\w+\.py)::", done.stdout, re.MULTILINE):
        workers[file].add(worker)
    assert sorted(workers) == ["test_a.py", "test_b.py", "test_c.py"], done.stdout
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    started = [line.split() for line in log.read_text().splitlines()]
    assert len(started) == 25, started
    (a_worker,) = workers["test_a.py"]
    assert next(file for worker, file in started if worker == a_worker) == "test_a.py", started


class _Item:
    """What tests/conftest.py's collection hook reads of a test: its path; it adds markers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.markers: list[str] = []

    def add_marker(self, marker: object) -> None:
        self.markers.append(getattr(marker, "name", str(marker)))


def test_the_long_files_are_handed_out_first_and_exist() -> None:
    tests = REPO / "tests"
    found = {name: sorted(tests.rglob(name)) for name in _LONG_FILES}
    assert all(len(paths) == 1 for paths in found.values()), "a long file was renamed or doubled: " + str(
        {n: p for n, p in found.items() if len(p) != 1}
    )
    short = [tests / "unit" / "test_a.py", tests / "integration" / "store" / "test_b.py"]
    items = [_Item(p) for p in [*short, *reversed([found[n][0] for n in _LONG_FILES]), short[0]]]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.path.name for i in items] == [*_LONG_FILES, "test_a.py", "test_b.py", "test_a.py"]
    assert "unit" in items[-1].markers and "integration" in items[-2].markers


def test_every_jvm_the_tests_start_compiles_with_c1_only() -> None:
    """Set once when pytest loads the conftest, inherited by every JVM a test starts (pyspark's
    spark-submit, subprocess jobs, Connect servers, private stacks); a user's own options stay."""
    ours = " ".join([TEST_JVM_OPTIONS, jvm_archive.options()]).strip()  # + the archive once built
    assert TEST_JVM_OPTIONS in os.environ["JAVA_TOOL_OPTIONS"].split()
    assert _with_test_jvm_options("") == ours
    assert _with_test_jvm_options("-Xss2m") == f"-Xss2m {ours}"
    assert _with_test_jvm_options(f"-Xss2m {ours}") == f"-Xss2m {ours}"


def test_the_class_data_archive_is_used_only_once_it_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(jvm_archive, "archive", lambda: tmp_path / "spark.jsa")
    assert jvm_archive.options() == ""  # a JVM told of a missing archive runs without the JDK's own
    (tmp_path / "spark.jsa").write_bytes(b"archive")
    uses = f"-XX:SharedArchiveFile={tmp_path / 'spark.jsa'} -Xlog:cds=off,cds+dynamic=off"
    assert jvm_archive.options() == uses
