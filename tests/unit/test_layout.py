"""The layout's rules, checked from the code's own imports (issues 21 and 43): size follows cohesion
(no module over 600 lines; over 400 only as one idea that re-exports nothing), the front-ends (cli/,
service/) over admin/, no import circle between modules, and the package's rooms in at most seven
layers, every import running down."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "txn_offsets"
MODULES = sorted(PACKAGE.rglob("*.py"))
#: the layers the package's rooms may stand in (the brief's ceiling for the import graph)
MAX_LAYERS = 7


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def dotted(path: Path) -> str:
    return ".".join(("txn_offsets", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__"
    )


NAMES = {dotted(p): p for p in MODULES}


@cache
def imports_of(path: Path) -> frozenset[str]:
    """The txn_offsets modules `path` imports anywhere in it (a function's lazy import counts: it is
    still an arrow of the layout), each resolved to the module or package it names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in NAMES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return frozenset(n for n in found if n in NAMES and n != dotted(path))


def room(module: str) -> str:
    """A module's room: the package folder or top-level module of txn_offsets it stands in."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_rules_see_the_package() -> None:
    assert len(MODULES) > 60 and any(rel(p) == "cli/main.py" for p in MODULES)
    assert "txn_offsets.commit.shell" in imports_of(PACKAGE / "commit" / "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_no_module_over_600_lines(path: Path) -> None:
    # size follows cohesion (../shared/STYLE.md): 600 is the ceiling, never a target to split or
    # squeeze a module to (the 350 of the second layout step shaped the tree by line count)
    assert len(path.read_text().splitlines()) <= 600


def _reexports(tree: ast.Module) -> set[str]:
    """The names of `__all__` that the module only imports."""
    exported: set[str] = set()
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            exported |= {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return exported & imported


@pytest.mark.parametrize("path", [p for p in MODULES if len(p.read_text().splitlines()) > 400], ids=rel)
def test_a_module_over_400_lines_is_one_idea_that_reexports_nothing(path: Path) -> None:
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    first = doc.split("\n\n", 1)[0]
    assert first and first.rstrip().endswith((".", ":")), (
        f"{rel(path)}: its docstring's first line names its idea"
    )
    assert not _reexports(tree), f"{rel(path)} re-exports {sorted(_reexports(tree))}"


@pytest.mark.parametrize("path", [p for p in MODULES if not rel(p).startswith("cli/")], ids=rel)
def test_nothing_below_the_cli_imports_it(path: Path) -> None:
    assert not {m for m in imports_of(path) if m.startswith("txn_offsets.cli")}


@pytest.mark.parametrize("path", [p for p in MODULES if rel(p).startswith("store/")], ids=rel)
def test_the_store_imports_no_layer_above_it(path: Path) -> None:
    above = ("txn_offsets.kafka", "txn_offsets.admin", "txn_offsets.spark", "txn_offsets.service")
    assert not {m for m in imports_of(path) if m.startswith(above)}


@pytest.mark.parametrize("path", [p for p in MODULES if rel(p).startswith("service/")], ids=rel)
def test_the_service_stands_on_admin_not_on_spark(path: Path) -> None:
    assert not {m for m in imports_of(path) if m.startswith(("txn_offsets.spark", "txn_offsets.cli"))}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of a directed graph, each once from where the walk met it."""
    done: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            visit(dep, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def module_graph() -> dict[str, set[str]]:
    return {name: set(imports_of(path)) for name, path in NAMES.items()}


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, deps in module_graph().items():
        graph.setdefault(room(name), set()).update(room(d) for d in deps if room(d) != room(name))
    return graph


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's layer: 1 for a room that imports no other, else one above the highest it imports."""
    found: dict[str, int] = {}

    def layer(node: str) -> int:
        if node not in found:
            found[node] = 1 + max((layer(d) for d in graph[node]), default=0)
        return found[node]

    for node in graph:
        layer(node)
    return found


def test_no_module_import_circle() -> None:
    found = circles(module_graph())
    assert not found, "\n".join(" -> ".join(c) for c in found[:5])


def test_the_rooms_stand_in_at_most_seven_layers_every_import_running_down() -> None:
    graph = room_graph()
    assert not circles(graph), "an import runs back up: " + str(circles(graph)[:3])
    depth = layers(graph)
    assert max(depth.values()) <= MAX_LAYERS, sorted(depth.items(), key=lambda kv: kv[1])


def test_the_checks_find_a_circle_and_count_layers() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert layers({"a": {"b"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}


#: functions of txn_offsets still taking the loose (engine, DatabaseSettings) pair instead of one
#: Store (txn_offsets.store.handle), counted by test_few_functions_take_the_loose_engine_and_settings:
#: 58 before the handle, 25 after admin/, cli/, service/, commit_ranges and the store's own were
#: converted, 6 once plan/, spark/ and store/runs.py, lease.py were too (the issue's target: fewer
#: than 15). The 6 stay by design: the executor side of the commit shell (5: it takes the worker's
#: engine, a Store never crosses to executors) and the engine's own setup (pooler, 1). The bound is
#: one above them (the check is strict): a seventh function taking the pair fails it.
MAX_ENGINE_AND_SETTINGS = 7


def _annotation(node: ast.expr | None) -> str:
    """The last dotted part of an annotation (``sa.Engine``, ``"DatabaseSettings"``), or ''."""
    if node is None:
        return ""
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)
    return text.strip("'\"").rsplit(".", 1)[-1]


def takes_engine_and_settings(path: Path) -> list[str]:
    """The functions of `path` with a parameter engine/eng (or annotated Engine) and one annotated
    DatabaseSettings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            engine = any(p.arg in ("engine", "eng") or _annotation(p.annotation) == "Engine" for p in params)
            settings = any(_annotation(p.annotation) == "DatabaseSettings" for p in params)
            if engine and settings:
                found.append(f"{rel(path)}:{node.lineno} {node.name}")
    return found


def test_few_functions_take_the_loose_engine_and_settings() -> None:
    found = [f for path in MODULES for f in takes_engine_and_settings(path)]
    assert len(found) < MAX_ENGINE_AND_SETTINGS, "take a Store instead:\n" + "\n".join(found)


def test_the_count_sees_the_pair() -> None:
    shell = PACKAGE / "commit" / "shell.py"  # the executor side keeps the worker's engine + settings
    assert any(f.endswith(" commit_unit") for f in takes_engine_and_settings(shell))
