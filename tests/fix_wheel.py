"""The package as a user installs it: built like ``make dist``, installed into a fresh virtualenv.

The wheel and the sdist are built with ``python -m build`` (the sdist first, then the wheel from it:
what ``make dist`` runs) from a copy of the package's sources alone - pyproject.toml, setup.py,
README.md, txn_offsets/ and the top-level migrations/, which the build puts inside the package - so
nothing else of the repository can reach them. The wheel is installed with plain ``pip install``,
its real dependencies and the ``connect`` extra (the README's Structured Streaming example needs its
pyarrow) into a ``python -m venv`` outside the checkout. pip's cache makes that quick after the
first time: measured 2026-11-28 on the 2-core machine, ~1 min (build 15 s, install 46 s) with a load
of ~5, ~3 min with a load of ~9; once per test run (the first pytest-xdist worker that needs it builds
it, under a lock; the other reuses it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fix_services import REPO

#: what a user's shell does not have: this checkout's settings, its interpreter and its Spark set-up
_NOT_A_USERS = ("TXN_OFFSETS_", "PYTHON", "PYSPARK_", "SPARK_", "VIRTUAL_ENV")


@dataclass(frozen=True)
class Installed:
    """A virtualenv holding the built wheel, and the files ``make dist`` made."""

    venv: Path
    wheel: Path
    sdist: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A user's shell with this virtualenv active: `base` (default: this process's environment)
        without this checkout's settings (TXN_OFFSETS_*, PYTHONPATH, PYSPARK_*, SPARK_*), the
        virtualenv's bin first on PATH."""
        env = {
            k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(_NOT_A_USERS)
        }
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", os.defpath)])
        env["VIRTUAL_ENV"] = str(self.venv)
        return env


def _sources(into: Path) -> Path:
    into.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, into / name)
    for folder in ("txn_offsets", "migrations"):
        shutil.copytree(REPO / folder, into / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def build_and_install(base: Path) -> Installed:
    """``make dist`` on a copy of the sources, then ``pip install 'WHEEL[connect]'`` into a new
    virtualenv under `base`."""
    dist = base / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(_sources(base / "src"))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("txn_offsets-*.whl")
    (sdist,) = dist.glob("txn_offsets-*.tar.gz")
    venv = base / "venv"
    # the base interpreter, not this checkout's venv: a fresh virtualenv as `python3 -m venv` makes it
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: pip would byte-compile every module of every dependency (pyspark's thousands)
    # first; Python compiles what it imports anyway, and nothing else of the install differs
    pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "-q", "install", "--no-compile"]
    pip.append(f"{wheel}[connect]")
    done = subprocess.run(pip, capture_output=True, text=True, timeout=900, check=False, cwd=base)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return Installed(venv, wheel, sdist)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Installed:
    """One install for the whole run: without pytest-xdist in this session's own temporary
    directory; with it in the directory the workers share (built by the first to ask)."""
    if worker_id == "master":
        return build_and_install(tmp_path_factory.mktemp("wheel"))
    shared = tmp_path_factory.getbasetemp().parent / "wheel"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        done = shared / "installed"
        if done.exists():
            venv, wheel, sdist = done.read_text().splitlines()
            return Installed(Path(venv), Path(wheel), Path(sdist))
        installed = build_and_install(Path(tempfile.mkdtemp(dir=shared)))
        done.write_text(f"{installed.venv}\n{installed.wheel}\n{installed.sdist}\n")
        return installed
