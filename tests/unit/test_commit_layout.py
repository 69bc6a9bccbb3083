"""The guard has one home (issue 41): only txn_offsets/commit/ claims, classifies a claim or proves a
topic's incarnation; every mode builds units and hands them to it. Checked from the code itself,
beside tests/unit/test_layout.py (which checks that the package's imports form no circle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.test_layout import MODULES, PACKAGE, imports_of, rel

#: the guard's own modules, and the functions that claim, classify a claim or prove an incarnation
GUARD_MODULES = ("txn_offsets.commit.claim", "txn_offsets.commit.classify", "txn_offsets.commit.shell")
GUARD_CALLS = {
    "claim",
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
    assert {"claim", "classify_claims", "transaction_outcome"} <= _calls(PACKAGE / "commit/shell.py") | (
        _calls(PACKAGE / "commit/claim.py")
    )


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
