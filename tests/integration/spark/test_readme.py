"""The README's usage example runs as printed, from an empty stack, as a user runs it.

Its blocks are taken from README.md verbatim (no name replaced): the two files (``setup_wordcount.py``,
``wordcount.py``) are written into an empty directory, and the shell block - which starts a local stack
in that directory with ``txn-offsets dev up``, migrates and grants as the owner, and runs the job as
the run role - runs there in bash, in a user's environment: the wheel as ``make dist`` builds it,
installed into a fresh virtualenv (tests/fix_wheel.py), nothing of this checkout's settings. So the
stack is a second, private one on ports of its own, stopped afterwards (``txn-offsets dev down``)
whatever happened. Then the Structured Streaming block is appended to ``wordcount.py`` as the README
says, and the shell block runs again on the same stack: the batch job counts nothing new (0
records), the stream counts the sentences once, into the same table.

Measured 2026-11-28 on the 2-core machine under a load of ~9: ~3 min for the wheel's build and
install (shared with tests/integration/test_wheel_install.py, once per run), then ~3.5 min for the
stack and the two runs (Spark, and the stream's Python workers, start in each).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fix_services import REPO
from tests.fix_wheel import Installed
from txn_offsets.devstack import postgres, read_env_file
from txn_offsets.store import migrate

SENTENCES = ["the quick brown fox", "jumps over the lazy dog", "the end"]  # what setup_wordcount.py produces
UNCONFINED = "runs as database role"  # the warning of a job run as the schema's owner


def readme_blocks() -> list[tuple[str, str, str]]:
    """(marker, language, code) of every block the README marks as executed by this test, in order."""
    text = (REPO / "README.md").read_text()
    found = re.findall(
        r"<!-- (usage-[^:]*): executed by tests/integration/spark/test_readme.py -->\s*```(\w+)\n(.*?)```",
        text,
        re.DOTALL,
    )
    assert found, "README.md lost its usage blocks"
    return found


class Project:
    """An empty directory of a user's, with the wheel's virtualenv active."""

    def __init__(self, root: Path, installed: Installed) -> None:
        self.root = root
        self.env = installed.environ()

    def write(self, marker: str, code: str) -> None:
        """A ``usage-file NAME`` block is written to NAME; ``usage-file NAME, appended`` is appended."""
        name, _, how = marker.removeprefix("usage-file ").partition(", ")
        with (self.root / name).open("a" if how == "appended" else "w") as fh:
            fh.write(code)

    def sh(self, script: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stack_env(self) -> dict[str, str]:
        return read_env_file(self.root / ".stack" / "env")


@pytest.fixture
def project(tmp_path: Path, installed_wheel: Installed) -> Iterator[Project]:
    root = tmp_path / "wordcount"
    root.mkdir()
    proj = Project(root, installed_wheel)
    try:
        yield proj
    finally:  # the private stack stops whatever happened; the project's cluster data goes with it
        down = proj.sh("txn-offsets dev down", timeout=180)
        data = postgres.cluster_for(root / ".stack", 1).data_dir.parent
        if not data.is_relative_to(tmp_path):  # /var/lib/txn-offsets/<digest>/postgres as root
            shutil.rmtree(data.parent, ignore_errors=True)
        assert down.returncode == 0, down.stderr


def _counts(project: Project) -> tuple[dict[str, int], dict[str, int]]:
    """The table's counts and each job's stored offsets (summed over partitions), read as the owner."""
    engine = sa.create_engine(project.stack_env()["TXN_OFFSETS_OWNER_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            words = dict(conn.execute(sa.text("SELECT word, n FROM wordcount.word_counts")).all())
            stored = conn.execute(sa.text("SELECT job, sum(off) FROM txn_offsets.offsets GROUP BY job"))
            offsets = {job: int(total) for job, total in stored.all()}
    finally:
        engine.dispose()
    return words, offsets


def _ran(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert UNCONFINED not in done.stderr, done.stderr[-3000:]  # it runs as the run role
    return done.stdout.splitlines()


def test_readme_usage_example_runs_as_printed_from_an_empty_stack(project: Project) -> None:
    blocks = readme_blocks()
    files = [
        (marker, code)
        for marker, lang, code in blocks
        if marker.startswith("usage-file") and lang == "python"
    ]
    (shell,) = [code for marker, lang, code in blocks if marker == "usage-shell" and lang == "bash"]
    first = [(m, c) for m, c in files if not m.endswith(", appended")]
    stream = [(m, c) for m, c in files if m.endswith(", appended")]
    assert [m for m, _ in first] == ["usage-file setup_wordcount.py", "usage-file wordcount.py"]
    assert [m for m, _ in stream] == ["usage-file wordcount.py, appended"]
    for marker, code in first:
        project.write(marker, code)

    out = _ran(project.sh(shell))
    assert out[0].startswith("stack up: postgres pid "), out
    assert f"schema 'txn_offsets' is at revision {migrate.head()}" in out
    assert out[-1] == f"{len(SENTENCES)} records counted exactly once in 1 batches", out
    words = collections.Counter(word for sentence in SENTENCES for word in sentence.split())
    assert _counts(project) == (dict(words), {"word-count": len(SENTENCES)})
    assert project.stack_env()["TXN_OFFSETS_DATABASE_URL"].startswith("postgresql+psycopg://job_runner:")

    # continuing the example: the stream block appended to wordcount.py, the shell block run again
    project.write(*stream[0])
    out = _ran(project.sh(shell))
    assert out[-1] == "0 records counted exactly once in 0 batches", out  # the batch job: nothing new
    doubled = {word: 2 * n for word, n in words.items()}  # the stream, a job of its own, counted them
    assert _counts(project) == (doubled, {"word-count": len(SENTENCES), "word-count-stream": len(SENTENCES)})
