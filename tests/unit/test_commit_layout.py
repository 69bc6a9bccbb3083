"""The guard has one home (issue 41): only txn_offsets/commit/ claims, classifies a claim or proves a
topic's incarnation; every mode builds units and hands them to it. Checked from the code itself,
beside tests/unit/test_layout.py; and the package's imports form no circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.test_layout import MODULES, PACKAGE, imports_of, rel

#: the guard's own modules, and the functions that claim, classify a claim or prove an incarnation
GUARD_MODULES = ("txn_offsets.commit.claim", "txn_offsets.commit.classify", "txn_offsets.commit.shell")
GUARD_CALLS = {
    "claim_ranges",
    "check_incarnation",
    "classify_claim",
    "classify_claims",
    "classify_reread",
    "transaction_outcome",
    "start_proofs",
}
OUTSIDE = [p for p in MODULES if not rel(p).startswith("commit/")]


def _calls(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def _imported_names(path: Path) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("txn_offsets")
        for alias in node.names
    }


def test_the_commit_core_is_there() -> None:
    core = {rel(p) for p in MODULES if rel(p).startswith("commit/")}
    assert {"commit/claim.py", "commit/classify.py", "commit/proof.py", "commit/shell.py"} <= core
    # and its functions are found by the checks below
    assert {"claim_ranges", "classify_claims", "transaction_outcome"} <= _calls(
        PACKAGE / "commit/shell.py"
    ) | (_calls(PACKAGE / "commit/claim.py"))


@pytest.mark.parametrize("path", OUTSIDE, ids=rel)
def test_only_the_commit_core_claims_classifies_or_proves(path: Path) -> None:
    assert not {m for m in imports_of(path) if m.startswith(GUARD_MODULES)}
    assert not (_imported_names(path) | _calls(path)) & GUARD_CALLS


@pytest.mark.parametrize("path", OUTSIDE, ids=rel)
def test_no_other_module_writes_a_claim_statement(path: Path) -> None:
    """The claim is an UPDATE of an offset row guarded by its offset (``off = from``): no SQL text of
    another module updates ``off`` by comparing it (admin moves are audited moves under the job
    row's lock, written with SQLAlchemy by store/offset_rows.py, not claims)."""
    texts = [
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [t for t in texts if "UPDATE" in t.upper() and re.search(r"\boff\s*=", t)]


def _graph() -> dict[str, set[str]]:
    names = {".".join(("txn_offsets", *p.relative_to(PACKAGE).with_suffix("").parts)): p for p in MODULES}
    names = {n.removesuffix(".__init__"): p for n, p in names.items()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # module level: what importing it imports
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("txn_offsets"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in names else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("txn_offsets"))
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def test_the_import_graph_has_no_circle() -> None:
    graph = _graph()
    done: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            circles.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    assert not circles, "\n".join(" -> ".join(c) for c in circles[:5])
