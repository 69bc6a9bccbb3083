"""The package as users install it: the wheel ``make dist`` builds, in a fresh virtualenv.

tests/fix_wheel.py builds the wheel and the sdist with ``python -m build`` from a copy of the
package's sources alone and installs the wheel with ``pip install`` and its real dependencies into
a ``python -m venv`` outside the checkout (about a minute, once per test run). From there, in a
directory that is not the checkout, ``txn-offsets db upgrade``, ``db check`` and ``db current``
must work against the stack's PostgreSQL, with the package, its migrations and every dependency
taken from that virtualenv. tests/integration/spark/test_readme.py runs the README's job with it.
"""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.fix_wheel import Installed
from tests.integration.helpers import Cli
from txn_offsets.config import DatabaseSettings
from txn_offsets.store import migrate

REPO = Path(__file__).resolve().parents[2]


def _run(cwd: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_dist_files_hold_the_package_and_its_migrations(installed_wheel: Installed) -> None:
    with zipfile.ZipFile(installed_wheel.wheel) as whl:
        names = set(whl.namelist())
    assert {"txn_offsets/__init__.py", "txn_offsets/migrations/env.py", "txn_offsets/py.typed"} <= names
    assert any(n.startswith("txn_offsets/migrations/versions/0001") for n in names), sorted(names)
    with tarfile.open(installed_wheel.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {
        "pyproject.toml",
        "setup.py",
        "README.md",
        "migrations/env.py",
        "txn_offsets/__init__.py",
    } <= members


def test_wheel_install_runs_db_upgrade_check_current(
    installed_wheel: Installed, tmp_path: Path, database_url: str, pg_schema: str
) -> None:
    env = installed_wheel.environ()
    env["TXN_OFFSETS_DATABASE_URL"] = database_url
    cwd = tmp_path / "elsewhere"  # not the repository: its txn_offsets/ is not importable from here
    cwd.mkdir()
    python = str(installed_wheel.bin / "python")

    probe = _run(
        cwd,
        python,
        "-c",
        "import sys, sqlalchemy, pyspark, txn_offsets, txn_offsets.store.migrate as m; "
        "print(txn_offsets.__file__); print(m.MIGRATIONS_DIR); print(pyspark.__file__); "
        "print(sqlalchemy.__file__); print('\\n'.join(sys.path))",
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    module_file, migrations_dir, pyspark_file, sqlalchemy_file, *path = probe.stdout.splitlines()
    for found in (module_file, migrations_dir, pyspark_file, sqlalchemy_file):
        assert Path(found).is_relative_to(installed_wheel.venv), found  # nothing from the checkout's venv
    assert Path(migrations_dir).parent == Path(module_file).parent
    assert not any(p and Path(p).resolve() == REPO for p in path), path

    cli = [str(installed_wheel.bin / "txn-offsets")]
    s = ["--schema", pg_schema]
    head = migrate.head()
    before = _run(cwd, *cli, "db", "current", *s, env=env)
    assert (before.returncode, before.stderr) == (0, ""), before.stderr
    assert before.stdout == f"schema {pg_schema!r}: revision None (not created)\n"

    up = _run(cwd, *cli, "db", "upgrade", *s, env=env)
    assert (up.returncode, up.stderr) == (0, ""), up.stderr
    assert up.stdout == f"schema {pg_schema!r} is at revision {head}\n"

    checked = _run(cwd, *cli, "db", "check", *s, env=env)
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    assert checked.stdout == f"schema {pg_schema!r} is at head and matches the models\n"

    now = _run(cwd, *cli, "db", "current", *s, env=env)
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
