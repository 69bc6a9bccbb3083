"""``make test``'s two workers: each test file runs whole on one worker, the long files first.

pytest-xdist's ``--dist loadgroup`` was silently dealing out single tests on pytest 9 (xdist 3.8 tags
the node id, which pytest 9 no longer reads from ``_nodeid``): a file's module fixtures were built on
both workers and its tests interleaved with other files'. These tests run a small suite with the
Makefile's own ``TEST_WORKERS`` and check where each test ran."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import _LONG_FILES

REPO = Path(__file__).resolve().parents[2]


def _test_workers() -> list[str]:
    match = re.search(r"^TEST_WORKERS \?= (.*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile lost TEST_WORKERS"
    return shlex.split(match.group(1))


def test_each_file_runs_whole_on_one_worker(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        body = "".join(f"def test_{i}():\n    assert True\n\n" for i in range(12))
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


def test_the_long_files_are_collected_first() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    files: list[str] = []
    for line in done.stdout.splitlines():
        name = line.split("::", 1)[0].rsplit("/", 1)[-1]
        if "::" in line and (not files or files[-1] != name):
            files.append(name)
    long_ones = [f for f in _LONG_FILES if f in files]
    assert long_ones == list(_LONG_FILES), "a long file was renamed: update tests/conftest.py"
    assert files[: len(long_ones)] == long_ones
