"""``make install`` puts bytecode into the development virtualenv's ``pyspark.zip``
(txn_offsets/devstack/pyspark_bytecode.py): a zip of sources gets an unchecked hash-based ``.pyc``
beside each ``.py``, which Python's zip importer then loads instead of compiling the source at
every process start; tracebacks still name the source and show its lines; a second run changes
nothing; a source that does not compile keeps no bytecode and imports as before (it fails as it
did)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from txn_offsets.devstack.pyspark_bytecode import add_bytecode

SOURCES = {
    "pkg/__init__.py": "VALUE = 41\n",
    "pkg/mod.py": "from pkg import VALUE\n\n\ndef boom():\n    raise ValueError(VALUE + 1)\n",
    "pkg/broken.py": "def nope(:\n",
    "pkg/data.txt": "not python\n",
}


def _zip(tmp_path: Path) -> Path:
    path = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as out:
        for name, text in SOURCES.items():
            out.writestr(name, text)
    return path


def test_each_source_gets_bytecode_the_zip_importer_loads(tmp_path: Path) -> None:
    path = _zip(tmp_path)
    assert add_bytecode(path) == 2  # __init__ and mod; broken.py does not compile
    with zipfile.ZipFile(path) as done:
        names = set(done.namelist())
        assert names == {*SOURCES, "pkg/__init__.pyc", "pkg/mod.pyc"}
        assert all(done.read(n) == t.encode() for n, t in SOURCES.items())  # sources unchanged
    probe = (
        "import traceback, pkg.mod\n"
        "print(pkg.mod.__file__)\n"
        "try:\n    pkg.mod.boom()\nexcept ValueError:\n    traceback.print_exc()\n"
        "try:\n    import pkg.broken\nexcept SyntaxError as exc:\n    print('broken:', exc.msg)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.splitlines()[0] == f"{path}/pkg/mod.pyc"  # loaded from the bytecode
    assert f'File "{path}/pkg/mod.py", line 5, in boom' in ran.stderr
    assert "raise ValueError(VALUE + 1)" in ran.stderr  # the source line, read from the zip
    assert ran.stdout.splitlines()[1].startswith("broken: ")
    assert add_bytecode(path) == 0  # it has this Python's bytecode: left as it is


def test_bytecode_of_another_python_is_compiled_again(tmp_path: Path) -> None:
    path = _zip(tmp_path)
    with zipfile.ZipFile(path, "a") as out:
        out.writestr("pkg/mod.pyc", b"\x00\x00\x0d\x0a" + b"\x00" * 12 + b"junk")
    assert add_bytecode(path) == 2
    with zipfile.ZipFile(path) as done:
        assert sorted(n for n in done.namelist() if n.endswith(".pyc")) == ["pkg/__init__.pyc", "pkg/mod.pyc"]
