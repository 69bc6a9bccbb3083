"""Every module path the docs name exists, and is not an old path kept one release as a shim.

Checked: `txn_offsets/x/y.py` and `txn_offsets.x.y` (a module, or an attribute of one) in README.md and
docs/*.md; relative paths in code spans (`store/schema.py`, `tests/unit/`); the README's layout tree,
both ways (every entry exists; every module of the package is named in it); and the code references
of docs/protocol.md (`offset_rows.claim`, `runs.start_run`: a module named by its last parts, then
attributes), which say where each step of the protocol is implemented.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import txn_offsets
from txn_offsets.store.schema import metadata_for

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "txn_offsets"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TABLES = {t.name: t for t in metadata_for().tables.values()}
SOURCE = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
# where a relative path in the docs may start: the repository's folders and the package's
ROOTS = {p.name for p in (*REPO.iterdir(), *PACKAGE.iterdir()) if p.is_dir() and p.name[0] not in "._"}
# docs/protocol.md spans that look like code references but are Spark or Kafka settings
NOT_CODE = {"spark.task.maxFailures"}


def _modules() -> dict[str, ModuleType]:
    found = {"txn_offsets": txn_offsets}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for info in pkgutil.walk_packages(txn_offsets.__path__, "txn_offsets."):
            if info.name.endswith("__main__"):
                continue
            found[info.name] = importlib.import_module(info.name)
    return found


MODULES = _modules()


def _module_file(name: str) -> Path:
    path = Path(MODULES[name].__file__ or "")
    return path.parent if path.name == "__init__.py" else path


def _paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph."""
    found, start, lines = [], 1, []
    for number, line in enumerate([*path.read_text().splitlines(), ""], 1):
        if line.strip():
            lines.append(line)
            continue
        if lines:
            found.append((start, "\n".join(lines)))
        start, lines = number + 1, []
    return found


def _attribute_chain(obj: object, names: list[str]) -> bool:
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def dotted_problem(name: str) -> str | None:
    """Why `txn_offsets.x.y` names nothing current (None: it is fine)."""
    parts = name.split(".")
    if len(parts) == 2 and parts[1] in TABLES:
        return None  # schema-qualified SQL: txn_offsets.dead_letters
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        if module in MODULES:
            if _attribute_chain(MODULES[module], parts[k:]):
                return None
            break
    if f'"{name}"' in SOURCE:
        return None  # a name the code uses as a string: a logger
    return "no such module or attribute"


def path_problem(text: str) -> str | None:
    if text.split("/", maxsplit=1)[0] not in ROOTS:
        return None  # not a path of the repository (a checkpoint's commits/, the stack's .stack/)
    candidates = [REPO / text, PACKAGE / text]
    if not any(c.exists() for c in candidates):
        return "no such file or folder (relative to the repository or to txn_offsets/)"
    return None


def _mentions() -> list[tuple[str, int, str]]:
    """(doc, line, what) for every module path in the docs."""
    full = re.compile(r"(?<![\w./-])(txn_offsets(?:/[\w.]+)+/?|txn_offsets(?:\.[A-Za-z_]\w*)+)")
    relative = re.compile(r"`((?:[\w.-]+/)+(?:[\w.-]+\.py)?)`")
    found = []
    for path in DOCS:
        doc = str(path.relative_to(REPO))
        for start, text in _paragraphs(path):
            for pattern in (full, relative):
                for m in pattern.finditer(text):
                    line = start + text.count("\n", 0, m.start())
                    found.append((doc, line, m.group(1).rstrip(".")))
    return found


MENTIONS = _mentions()


def test_the_scan_finds_paths() -> None:
    names = {m[2] for m in MENTIONS}
    assert {"txn_offsets/store/schema.py", "txn_offsets.commit.claim.claim_ranges"} <= names
    assert len(MENTIONS) > 60
    assert dotted_problem("txn_offsets.spark.streaming")  # an old path, gone
    assert dotted_problem("txn_offsets.store.nowhere")
    assert path_problem("store/nowhere.py")


@pytest.mark.parametrize("mention", MENTIONS, ids=lambda m: f"{m[0]}:{m[1]}:{m[2]}")
def test_every_module_path_in_the_docs_exists(mention: tuple[str, int, str]) -> None:
    doc, line, what = mention
    if what.startswith("txn_offsets.") or what == "txn_offsets":
        problem = dotted_problem(what)
    else:
        problem = path_problem(what)
    assert problem is None, f"{doc}:{line}: {what}: {problem}"


# -- the README's layout tree


def layout_entries() -> list[tuple[int, str, Path]]:
    """(line, name, path) of every file or folder the README's layout names, entries and mentions in
    their descriptions (`session.py` in spark/'s description is spark/session.py)."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("## Layout")
    first = lines.index("```", start) + 1
    end = lines.index("```", first)
    entry = re.compile(r"^( {0,6})([\w.]+(?:\.py|/))(?:\s|$)")
    found: list[tuple[int, str, Path]] = []
    stack: list[tuple[int, Path]] = []  # (indent, folder)
    here = REPO
    for number in range(first, end):
        text = lines[number]
        m = entry.match(text)
        if m:
            indent, name = len(m.group(1)), m.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else REPO
            path = parent / name
            found.append((number + 1, name, path))
            if name.endswith("/"):
                stack.append((indent, path))
            here = path if name.endswith("/") else parent
            text = text[m.end() :]
        for mention in re.findall(r"(?<![\w./-])((?:\w+/)*\w+\.py)\b", text):
            options = [here / mention, PACKAGE / mention, REPO / mention]
            found.append((number + 1, mention, next((o for o in options if o.exists()), options[0])))
    return found


LAYOUT = layout_entries()


@pytest.mark.parametrize("entry", LAYOUT, ids=lambda e: f"README.md:{e[0]}:{e[1]}")
def test_every_layout_entry_exists(entry: tuple[int, str, Path]) -> None:
    line, name, path = entry
    assert path.exists(), (
        f"README.md:{line}: the layout names {name}, but {path.relative_to(REPO)} does not exist"
    )


def test_the_layout_names_every_module() -> None:
    named = {path.resolve() for _, _, path in LAYOUT}
    files = {_module_file(name) for name in MODULES}  # private modules (_java.py) may be left out
    missing = sorted(
        f.relative_to(REPO).as_posix()
        for f in files
        if f.resolve() not in named and not f.name.startswith("_")
    )
    assert not missing, f"README.md's layout does not name {missing}"


# -- docs/protocol.md: where each step is implemented


def relative_problem(span: str) -> str | None:
    """`offset_rows.claim`: a current module whose name ends with the first parts, then attributes."""
    parts = span.split(".")
    if parts[0] in TABLES:  # a column: jobs.first_plan_at
        return None if parts[1] in TABLES[parts[0]].c else f"table {parts[0]} has no column {parts[1]}"
    if not isinstance(getattr(txn_offsets, parts[0], txn_offsets), ModuleType):  # ReadOptions.max_tasks
        return None if _attribute_chain(txn_offsets, parts) else "no such attribute"
    for k in range(len(parts), 0, -1):
        suffix = "." + ".".join(parts[:k])
        modules = [mod for name, mod in MODULES.items() if f".{name}".endswith(suffix)]
        if modules:
            if any(_attribute_chain(mod, parts[k:]) for mod in modules):
                return None
            return f"module {parts[:k]} has no {'.'.join(parts[k:])}"
    return None  # names no module of ours (a file name, a Spark setting)


def protocol_spans() -> list[tuple[int, str]]:
    text = (REPO / "docs" / "protocol.md").read_text()
    return [
        (number, m.group(1))
        for number, line in enumerate(text.splitlines(), 1)
        for m in re.finditer(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`", line)
        if m.group(1) not in NOT_CODE and not m.group(1).startswith("txn_offsets.")
    ]


def test_protocol_names_code() -> None:
    spans = {s for _, s in protocol_spans()}
    assert {"transaction._attempt", "runs.start_run"} <= spans
    assert relative_problem("runs.no_such_function")


@pytest.mark.parametrize("span", protocol_spans(), ids=lambda s: f"docs/protocol.md:{s[0]}:{s[1]}")
def test_protocol_code_references_exist(span: tuple[int, str]) -> None:
    line, name = span
    problem = relative_problem(name)
    assert problem is None, (
        f"docs/protocol.md:{line}: `{name}`: {problem} (a Spark/Kafka setting? add it to NOT_CODE)"
    )
