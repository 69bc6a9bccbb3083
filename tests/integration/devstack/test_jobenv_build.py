"""The job env archive for real: `make job-env`'s build runs on the node Python alone once unpacked
(txn_offsets and its native dependencies from the env, no pyspark, no pip), and venv-pack's own
output for an editable install - which venv-pack packs without a word - is refused by the check.

Marked ``lab`` (``make test-lab``): a wheel built with build isolation, a venv and its requirements
installed, two archives packed: 100-115 s under load, over make test's budget; make test checks the
archive rules on small archives (tests/unit/devstack/test_jobenv.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from txn_offsets.devstack.lab import jobenv
from txn_offsets.devstack.lab.spawn import node_python
from txn_offsets.errors import StackError

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[3]
#: the node's view of the unpacked env: what it imports, from where
PROBE = """
import importlib.util, json, sys
import confluent_kafka, psycopg, sqlalchemy, txn_offsets
print(json.dumps({"txn_offsets": txn_offsets.__file__, "psycopg": psycopg.__file__,
                  "confluent_kafka": confluent_kafka.__file__, "sqlalchemy": sqlalchemy.__file__,
                  "pyspark": importlib.util.find_spec("pyspark") is not None,
                  "pip": importlib.util.find_spec("pip") is not None, "prefix": sys.prefix}))
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def test_the_built_archive_runs_on_the_node_python_alone(tmp_path: Path) -> None:
    built = jobenv.build(REPO, REPO / "dist" / "job-env.tar.gz")
    python = node_python()
    assert built.report.python_path == python
    assert built.report.python_version.rsplit(".", 1)[0] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert 10e6 < built.report.size_bytes < 60e6, built.report.describe()  # ~26 MB; with pyspark ~500 MB

    env = tmp_path / "env"  # as an executor unpacks --archives job-env.tar.gz#env
    env.mkdir()
    subprocess.run(["tar", "-xzf", str(built.report.path), "-C", str(env)], check=True, timeout=120)
    assert os.readlink(env / "bin" / "python3") == python
    done = subprocess.run([str(env / "bin" / "python"), "-c", PROBE], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    site = f"{env}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    for module in ("txn_offsets", "psycopg", "confluent_kafka", "sqlalchemy"):
        assert found[module] == f"{site}/{module}/__init__.py", found
    assert (found["pyspark"], found["pip"], found["prefix"]) == (False, False, str(env))


def test_venv_pack_packs_an_editable_install_and_the_check_refuses_it(tmp_path: Path) -> None:
    """The issue's trap: `pip install -e` leaves a PEP 660 finder that points back at the sources."""
    pkg = tmp_path / "mypkg"
    (pkg / "mypkg").mkdir(parents=True)
    (pkg / "mypkg" / "__init__.py").write_text("")
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mypkg"\nversion = "0.1"\n'
    )
    venv = tmp_path / "venv"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--python",
        str(venv / "bin" / "python"),
    ]
    for argv in (
        [node_python(), "-m", "venv", "--without-pip", str(venv)],
        [*pip, "install", "-q", "-e", str(pkg)],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    archive = tmp_path / "editable.tar.gz"
    packed = subprocess.run(
        [sys.executable, "-m", "venv_pack", "-p", str(venv), "-o", str(archive), "--quiet"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert packed.returncode == 0, packed.stderr  # venv-pack itself does not mind
    with pytest.raises(
        StackError, match=r"__editable__.* is an editable install's pointer back to its sources"
    ):
        jobenv.check_archive(archive)
