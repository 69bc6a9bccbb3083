"""The package as users install it: a wheel, not the editable checkout.

The wheel is built from a copy of its sources alone (pyproject.toml, setup.py, README.md,
txn_offsets/ and the top-level migrations/, which the build puts inside the package), so nothing
else of the repository can be reached; it is installed with ``pip install --no-deps --target DIR``
and run with ``python -S`` (no site-packages .pth files, so the editable install's path hook never
runs) on PYTHONPATH=DIR plus the repository venv's site-packages for the dependencies.
`db upgrade`, `db check` and `db current` must work against the stack's PostgreSQL from that install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.integration.helpers import Cli
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import migrate

REPO = Path(__file__).resolve().parents[2]


def _build_and_install(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in ("txn_offsets", "migrations"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp_path / "wheels"
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(src)], check=True, timeout=180)
    (wheel,) = wheels.glob("txn_offsets-*.whl")
    target = tmp_path / "target"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
        check=True,
        timeout=120,
    )
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_and_install(tmp_path_factory.mktemp("wheel"))


def _run(installed: Path, cwd: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    site_packages = sysconfig.get_paths()["purelib"]
    return subprocess.run(
        [sys.executable, "-S", *argv],
        cwd=cwd,
        env={**env, "PYTHONPATH": os.pathsep.join([str(installed), site_packages])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_wheel_install_runs_db_upgrade_check_current(
    installed: Path, tmp_path: Path, database_url: str, pg_schema: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TXN_OFFSETS_", "PYTHON"))}
    env["TXN_OFFSETS_DATABASE_URL"] = database_url
    cwd = tmp_path / "elsewhere"  # not the repository: its txn_offsets/ is not importable from here
    cwd.mkdir()

    probe = _run(
        installed,
        cwd,
        "-c",
        "import sys, txn_offsets, txn_offsets.store.migrate as m; "
        "print(txn_offsets.__file__); print(m.MIGRATIONS_DIR); print('\\n'.join(sys.path))",
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    module_file, migrations_dir, *path = probe.stdout.splitlines()
    assert Path(module_file).is_relative_to(installed)
    assert Path(migrations_dir).is_relative_to(installed / "txn_offsets")
    assert not any(p and Path(p).resolve() == REPO for p in path), path

    cli = ["-m", "txn_offsets.cli"]
    s = ["--schema", pg_schema]
    head = migrate.head()
    before = _run(installed, cwd, *cli, "db", "current", *s, env=env)
    assert (before.returncode, before.stderr) == (0, ""), before.stderr
    assert before.stdout == f"schema {pg_schema!r}: revision None (not created)\n"

    up = _run(installed, cwd, *cli, "db", "upgrade", *s, env=env)
    assert (up.returncode, up.stderr) == (0, ""), up.stderr
    assert up.stdout == f"schema {pg_schema!r} is at revision {head}\n"

    checked = _run(installed, cwd, *cli, "db", "check", *s, env=env)
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    assert checked.stdout == f"schema {pg_schema!r} is at head and matches the models\n"

    now = _run(installed, cwd, *cli, "db", "current", *s, env=env)
    assert (now.returncode, now.stdout) == (0, f"schema {pg_schema!r}: revision {head} (head)\n"), now.stderr


def test_missing_scripts_name_the_command_and_the_fix(
    run_cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, db: DatabaseSettings
) -> None:
    """A broken install (no scripts in the package): one line naming the command that was run and
    the fix, for every db command; before, `db current` was an alembic traceback and `db check`
    named a `db setup` command that does not exist."""
    monkeypatch.setattr(migrate, "MIGRATIONS_DIR", tmp_path / "gone")
    for action in ("check", "current", "upgrade"):
        code, out, err = run_cli("db", action, "--schema", db.schema)
        assert code == 1, (action, out, err)
        assert err.startswith(f"txn-offsets: error: `txn-offsets db {action}` on schema {db.schema!r}: ")
        assert "env.py, script.py.mako, versions not in" in err and "reinstall txn-offsets" in err
        assert err.count("\n") == 1 and "db setup" not in err
