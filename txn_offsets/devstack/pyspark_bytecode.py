"""The installed pyspark's ``pyspark.zip`` with bytecode beside its sources, for this machine's runs.

Every Python process Spark starts for a job - the worker daemon of each pool, a Python data
source's planner and each streaming query's source runner, each ``foreachBatch`` worker of a Spark
Connect session - imports pyspark from ``pyspark/python/lib/pyspark.zip`` (Spark puts it first on
the workers' ``PYTHONPATH``), never from the installed package. The zip holds sources only and
Python never writes bytecode into a zip, so each of those processes compiles every pyspark module
it imports, every time: measured 2026-11-29 on the 2-core machine, 0.9-1.3 s of CPU per process
(``pyspark.daemon`` + ``pyspark.worker`` 1.6 s from the zip, 0.35 s from the installed package);
one test file of the streaming adapter started 47 such processes.

:func:`add_bytecode` rewrites the zip with an unchecked hash-based ``.pyc`` (PEP 552) next to each
``.py``, where Python's zip importer looks for them: the same sources, compiled by this
interpreter, each code object named after the path the zip importer would give it (tracebacks
and their source lines are unchanged). ``make install`` runs it on the development virtualenv;
nothing of the package calls it, and a user's or a cluster's pyspark is never touched. A zip that
already holds bytecode, or whose bytecode is of another Python, is left (or rebuilt) accordingly.
"""

from __future__ import annotations

import argparse
import importlib.util
import marshal
import os
import sys
import warnings
import zipfile
from pathlib import Path

__all__ = ["add_bytecode", "pyspark_zip"]

_UNCHECKED_HASH = (0b01).to_bytes(4, "little")  # PEP 552 flags: hash-based, source not checked


def pyspark_zip() -> Path:
    """The ``pyspark.zip`` Spark's Python workers import pyspark from, for the installed pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("pyspark is not installed in this environment")
    found = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    if not found.is_file():
        raise FileNotFoundError(f"no pyspark.zip at {found}")
    return found


def _pyc(source: bytes, filename: str) -> bytes:
    with warnings.catch_warnings():  # what the zip importer would say at import, not at build
        warnings.simplefilter("ignore")
        code = compile(source, filename, "exec", dont_inherit=True)
    return (
        importlib.util.MAGIC_NUMBER
        + _UNCHECKED_HASH
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def add_bytecode(path: Path) -> int:
    """Rewrite the zip at `path` with a ``.pyc`` beside each ``.py`` (see the module); the number of
    modules compiled (0: it already held this Python's bytecode). A source that does not compile
    is left without one (the zip importer then compiles it, as before)."""
    with zipfile.ZipFile(path) as src:
        compiled = [i for i in src.infolist() if i.filename.endswith(".pyc")]
        if compiled and src.read(compiled[0])[:4] == importlib.util.MAGIC_NUMBER:
            return 0
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        done = 0
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for info in src.infolist():
                    if info.filename.endswith(".pyc"):
                        continue  # of another Python: compiled again from its source
                    data = src.read(info)
                    out.writestr(zipfile.ZipInfo(info.filename, info.date_time), data, zipfile.ZIP_DEFLATED)
                    if not info.filename.endswith(".py"):
                        continue
                    try:
                        pyc = _pyc(data, f"{path}{os.sep}{info.filename}")
                    except (SyntaxError, ValueError):
                        continue
                    out.writestr(
                        zipfile.ZipInfo(info.filename + "c", info.date_time), pyc, zipfile.ZIP_DEFLATED
                    )
                    done += 1
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m txn_offsets.devstack.pyspark_bytecode", description=__doc__
    )
    parser.add_argument("--zip", type=Path, default=None, help="default: the installed pyspark's pyspark.zip")
    args = parser.parse_args(argv)
    try:
        path = args.zip or pyspark_zip()
        done = add_bytecode(path)
    except (OSError, zipfile.BadZipFile) as exc:
        print(f"pyspark bytecode: {exc}", file=sys.stderr)
        return 1
    print(
        f"pyspark bytecode: {done} modules compiled into {path}"
        if done
        else f"pyspark bytecode: {path} has it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
