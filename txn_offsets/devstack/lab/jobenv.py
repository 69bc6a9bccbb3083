"""The job environment spark-submit ships to a cluster (``--archives job-env.tar.gz#env``): txn_offsets'
wheel and its requirements but pyspark, in a venv made by the Python the nodes run, packed by
venv-pack and checked before it is used.

``make job-env`` (``python -m txn_offsets.devstack.lab.jobenv``) writes ``dist/job-env.tar.gz``:

1. the wheel, built by ``pip wheel --no-deps`` with build isolation from a clean copy of the checkout's
   wheel sources (never an editable install: venv-pack would pack a finder pointing back here);
2. a venv without pip made by the node Python (``LAB_NODE_PYTHON`` or ``--python``, default
   ``/usr/bin/python3``; its major.minor must be the driver's: PySpark refuses a worker of another
   minor version). The venv's ``bin/python`` links to that path, so every node needs it there;
3. the wheel and its requirements read from the wheel's metadata, extras and pyspark skipped (the
   cluster's SPARK_HOME brings pyspark.zip: with pyspark the archive is ~500 MB), installed by this
   interpreter's pip into the venv (``pip --python``);
4. ``venv-pack``, then :func:`check_archive`. A stamp over the wheel's sources and the node Python
   (and the archive's size and mtime) skips all of it while nothing changed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import email.parser
import fcntl
import hashlib
import importlib.util
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from txn_offsets.devstack.lab.spawn import NODE_PYTHON_VARIABLE, node_python
from txn_offsets.errors import StackError, TxnOffsetsError

__all__ = [
    "ArchiveReport",
    "build",
    "check_archive",
    "requirements_without",
    "wheel_requirements",
]

SERVICE = "job env"
#: what a Spark cluster brings itself: never packed
CLUSTER_PROVIDED = frozenset({"pyspark"})
#: what the wheel is built from (pyproject.toml's metadata and readme, setup.py's package list)
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "txn_offsets", "migrations")
_SITE = re.compile(r"lib/python3\.\d+/site-packages/")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_without(requires: Iterable[str], skip: Iterable[str] = CLUSTER_PROVIDED) -> list[str]:
    """The ``Requires-Dist`` lines to install: those of an extra (a marker naming ``extra``) and those
    naming a project in `skip` (compared as PEP 503 normalized names) left out, the rest as written."""
    skipped = {_normalized(s) for s in skip}
    kept = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        name = re.match(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)", requirement)
        if name is None:
            raise StackError(SERVICE, f"cannot read the requirement {line!r}", "fix the wheel's metadata")
        if re.search(r"\bextra\b", marker) or _normalized(name.group(1)) in skipped:
            continue
        kept.append(line.strip())
    return kept


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, from its ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        message = email.parser.Parser().parsestr(zf.read(metadata).decode())
    return list(message.get_all("Requires-Dist") or [])


@dataclasses.dataclass(frozen=True)
class ArchiveReport:
    """What :func:`check_archive` found in a job env archive."""

    path: Path
    size_bytes: int
    members: int
    txn_offsets_version: str
    python_version: str  # pyvenv.cfg's: the node Python the env was made with
    python_path: str  # where bin/python's links lead: every node needs that Python there

    def describe(self) -> str:
        return (
            f"{self.path}: {self.size_bytes / 1e6:.1f} MB, {self.members} members (txn_offsets "
            f"{self.txn_offsets_version}, no pyspark); every node needs Python {self.python_version} "
            f"at {self.python_path} (bin/python links there) and a SPARK_HOME with pyspark"
        )


def _refuse(path: Path, problem: str, fix: str = "build it with `make job-env`") -> StackError:
    return StackError(SERVICE, f"{path}: {problem}", fix)


def _python_target(path: Path, members: dict[str, tarfile.TarInfo]) -> str:
    """The path bin/python's links end at (outside the archive: the node's interpreter)."""
    current = "bin/python"
    for _ in range(16):
        member = members.get(current)
        if member is None:
            if current.startswith("/"):
                return current
            raise _refuse(path, f"bin/python leads to {current}, which is not in the archive")
        if not member.issym():
            return f"{current} (a file in the archive)"
        target = member.linkname
        current = target if target.startswith("/") else posixpath.normpath(posixpath.join("bin", target))
    raise _refuse(path, "bin/python is a loop of links")


def _pth_escape(name: str, text: str) -> str | None:
    """The first line of a .pth file that adds a path outside the env, if any (import lines run code
    and add nothing: an editable finder is refused by its module's name)."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "import ", "import\t")):
            continue
        if line.startswith("/") or posixpath.normpath(
            posixpath.join(posixpath.dirname(name), line)
        ).startswith(".."):
            return line
    return None


def check_archive(path: Path) -> ArchiveReport:
    """Refuse (one line naming the member) an archive that would not run on a node without this
    checkout: an editable install, a .pth path outside the env, pyspark inside, no txn_offsets;
    else what the nodes need."""
    with _opened(path) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        txn_version = ""
        for name, member in members.items():
            site = _SITE.search(name)
            inside = name[site.end() :] if site else ""
            if "__editable__" in name or name.endswith(".egg-link"):
                raise _refuse(path, f"{name} is an editable install's pointer back to its sources")
            if site and (inside == "pyspark" or inside.startswith("pyspark/")):
                raise _refuse(path, f"{name}: pyspark is packed (the cluster's SPARK_HOME has it)")
            if (
                site
                and inside.endswith(".dist-info/direct_url.json")
                and member.isfile()
                and json.loads(_read(tar, member)).get("dir_info", {}).get("editable")
            ):
                raise _refuse(path, f"{name} records an editable install")
            if name.endswith(".pth") and member.isfile():
                line = _pth_escape(name, _read(tar, member))
                if line is not None:
                    raise _refuse(path, f"{name} adds {line!r}, a path outside the env")
            found = re.fullmatch(r"txn_offsets-([^/-]+)\.dist-info", inside.split("/")[0]) if site else None
            if found:
                txn_version = found.group(1)
        if not any(
            re.fullmatch(r"lib/python3\.\d+/site-packages/txn_offsets/__init__\.py", n) for n in members
        ):
            raise _refuse(path, "lib/python3.*/site-packages/txn_offsets/__init__.py is missing")
        cfg = members.get("pyvenv.cfg")
        if cfg is None:
            raise _refuse(path, "pyvenv.cfg is missing: not a venv")
        lines = (ln.partition("=") for ln in _read(tar, cfg).splitlines())
        settings = {k.strip(): v.strip() for k, _, v in lines}
        python_path = _python_target(path, members)
    return ArchiveReport(
        path=path,
        size_bytes=path.stat().st_size,
        members=len(members),
        txn_offsets_version=txn_version or "?",
        python_version=settings.get("version", settings.get("version_info", "?")),
        python_path=python_path,
    )


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tarfile.TarFile]:
    try:
        tar = tarfile.open(path, "r:gz")  # noqa: SIM115 - closed below; its errors are refusals
    except (OSError, tarfile.TarError) as exc:
        raise _refuse(path, f"not a readable tar.gz ({exc})") from None
    with tar:
        yield tar


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    fh = tar.extractfile(member)
    return fh.read().decode(errors="replace") if fh else ""


def _sources(checkout: Path) -> list[str]:
    """The wheel's sources as git lists them (tracked and new, ignored ones left out)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(checkout), "ls-files", "-z", "-co", "--exclude-standard", "--", *WHEEL_SOURCES],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        raise StackError(
            SERVICE, f"cannot list the sources of {checkout} ({exc})", "run it in a git checkout"
        ) from None
    return sorted({n for n in listed.decode().split("\0") if n and (checkout / n).is_file()})


def _digest(checkout: Path, files: Sequence[str], python: str, extra: Sequence[str] = ()) -> str:
    """Over the wheel's sources, the node Python (its path and the interpreter it leads to) and the
    extra requirements."""
    real = Path(python).resolve()
    st = real.stat()
    h = hashlib.sha256(f"{python}\0{real}\0{st.st_size}\0{st.st_mtime_ns}\0{sorted(extra)}\0".encode())
    for name in files:
        h.update(name.encode() + b"\0" + hashlib.sha256((checkout / name).read_bytes()).digest())
    return h.hexdigest()


def _run(what: str, argv: Sequence[str], log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
        )
    if done.returncode != 0:
        raise StackError(SERVICE, f"{what} failed (exit {done.returncode})", f"read {log}")


@contextlib.contextmanager
def _locked(work: Path) -> Iterator[None]:
    """One build at a time per work directory (make job-env beside a test that needs the archive)."""
    work.mkdir(parents=True, exist_ok=True)
    with (work / "lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@dataclasses.dataclass(frozen=True)
class Built:
    """What :func:`build` left: the archive's report, whether it was rebuilt, how long it took."""

    report: ArchiveReport
    rebuilt: bool
    seconds: float


def build(checkout: Path, out: Path, *, force: bool = False, extra: Sequence[str] = ()) -> Built:
    """``out`` (a job env archive) for the checkout's txn_offsets made with the node Python
    (:func:`.spawn.node_python`: $LAB_NODE_PYTHON), plus the `extra` requirements (``pyarrow``: what
    ``open_stream``'s source needs on the nodes), rebuilt only when the wheel's sources, the node
    Python or the extras changed since the stamp in ``<checkout>/build/<out's name>``."""
    started = time.monotonic()
    checkout = checkout.resolve()
    node = node_python()
    if importlib.util.find_spec("venv_pack") is None:
        raise StackError(
            SERVICE, f"venv-pack is not installed in {sys.prefix}", "pip install venv-pack (make install)"
        )
    refused = sorted(set(extra) - set(requirements_without(extra)))
    if refused:
        raise StackError(SERVICE, f"{refused[0]!r} is the cluster's own or an extra", "do not pack it")
    work = checkout / "build" / out.name.removesuffix(".tar.gz")
    with _locked(work):
        files = _sources(checkout)
        digest = _digest(checkout, files, node, extra)
        stamp_file = work / "stamp.json"
        stamp = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
        if not force and out.exists() and stamp.get("key") == _stamp(digest, out):
            # the archive the stamp names, unchanged since it was checked (size and mtime): its report
            report = ArchiveReport(**{**stamp["report"], "path": out})
            return Built(report, False, time.monotonic() - started)
        log = work / "build.log"
        log.unlink(missing_ok=True)
        src, wheels, venv = work / "src", work / "wheels", work / "venv"
        for old in (src, wheels, venv):
            shutil.rmtree(old, ignore_errors=True)
        for name in files:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkout / name, src / name)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run("building the wheel", [*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)], log)
        (wheel,) = wheels.glob("txn_offsets-*.whl")
        _run("making the venv", [node, "-m", "venv", "--without-pip", str(venv)], log)
        into = [*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-warn-script-location"]
        wanted = [*requirements_without(wheel_requirements(wheel)), *extra]
        _run("installing the requirements", [*into, *wanted], log)
        _run("installing the wheel", [*into, "--no-deps", str(wheel)], log)
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        part.unlink(missing_ok=True)
        pack = [sys.executable, "-m", "venv_pack", "-p", str(venv), "-o", str(part), "--format", "tar.gz"]
        _run("packing the venv", [*pack, "--quiet"], log)
        report = check_archive(part)
        part.replace(out)
        report = dataclasses.replace(report, path=out)
        checked = {k: v for k, v in dataclasses.asdict(report).items() if k != "path"}
        stamp_file.write_text(json.dumps({"key": _stamp(digest, out), "report": checked}))
        return Built(report, True, time.monotonic() - started)


def _stamp(digest: str, out: Path) -> dict[str, object]:
    st = out.stat() if out.exists() else None
    return {
        "digest": digest,
        "archive": str(out.resolve()),
        "size": st and st.st_size,
        "mtime_ns": st and st.st_mtime_ns,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m txn_offsets.devstack.lab.jobenv``: build (if stale) and check the archive."""
    parser = argparse.ArgumentParser(prog="python -m txn_offsets.devstack.lab.jobenv", description=__doc__)
    parser.add_argument("--checkout", type=Path, default=Path.cwd(), help="the repository (default: here)")
    parser.add_argument("--out", type=Path, default=Path("dist/job-env.tar.gz"))
    parser.add_argument(
        "--python", help=f"the nodes' Python: sets ${NODE_PYTHON_VARIABLE} (default /usr/bin/python3)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp says it is current")
    parser.add_argument("--check", type=Path, metavar="ARCHIVE", help="only check an existing archive")
    parser.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="a requirement to pack beside txn_offsets' own (repeatable): pyarrow for open_stream",
    )
    args = parser.parse_args(argv)
    if args.python:
        os.environ[NODE_PYTHON_VARIABLE] = args.python
    try:
        if args.check:
            print(check_archive(args.check).describe())
            return 0
        built = build(args.checkout, args.out, force=args.force, extra=args.extra)
    except TxnOffsetsError as exc:
        print(f"job-env: error: {exc}", file=sys.stderr)
        return 1
    how = f"built in {built.seconds:.0f} s" if built.rebuilt else "up to date (stamp)"
    print(f"{built.report.describe()}; {how}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
