"""benchmarks.profile_modes says how to install py-spy when it is missing, before it starts anything."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from benchmarks import profile_modes


def test_missing_py_spy_is_named_with_its_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "bin" / "py-spy"
    monkeypatch.setattr(profile_modes, "PY_SPY", missing)
    # from_env is the first thing that touches the stack: it must not be reached
    monkeypatch.setattr(profile_modes, "from_env", lambda: pytest.fail("started before checking py-spy"))
    assert profile_modes.main(["--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err
    assert "pip install -e '.[dev]'" in err


def test_the_dev_extra_installs_py_spy() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    assert any(requirement.startswith("py-spy") for requirement in dev)
