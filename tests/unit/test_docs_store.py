"""The docs' facts about the store, the environment and the build match the code: the tables of
docs/store.md and store/schema.py, the GRANT listings and `txn-offsets db grants`, the migrations
table and revision numbers and migrations/versions, the environment variables and what
the code reads, the Python and pyspark floors and pyproject.toml, and an arch-independent Dockerfile."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from txn_offsets.cli import main as cli
from txn_offsets.store.schema import metadata_for, run_role_grants

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VERSIONS = REPO / "migrations" / "versions"
TABLES = {t.name for t in metadata_for().tables.values()}


def _section(path: Path, heading: str) -> str:
    """From `heading` to the next heading (of any level)."""
    text = path.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(r"^#{1,6} [A-Z]", text[start:], re.MULTILINE)
    return text[start : start + end.start()] if end else text[start:]


def _first_column(table_text: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", table_text, re.MULTILINE)


# -- tables


def test_store_md_lists_every_table_of_the_schema() -> None:
    listed = set(_first_column(_section(REPO / "docs" / "store.md", "## Tables")))
    assert listed == TABLES, (
        f"docs/store.md's table list: missing {sorted(TABLES - listed)}, "
        f"not in store/schema.py {sorted(listed - TABLES)}"
    )


# -- grants


def _printed(argv: list[str]) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(argv) == 0, argv
    return out.getvalue().splitlines()


def grant_listings() -> list[tuple[str, int, list[str]]]:
    """(doc, line, statements) of every listing of GRANT statements in a code block."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        block: list[str] = []
        for number, line in enumerate(lines, 1):
            if re.match(r"(GRANT|INSERT INTO) ", line):
                block.append(line)
                continue
            if block:
                found.append((str(path.relative_to(REPO)), number - len(block), block))
                block = []
    return found


def test_the_docs_have_grant_listings() -> None:
    docs = {doc for doc, _, _ in grant_listings()}
    assert {"docs/operations.md", "docs/store.md"} <= docs


@pytest.mark.parametrize("listing", grant_listings(), ids=lambda g: f"{g[0]}:{g[1]}")
def test_grant_listings_are_what_db_grants_prints(
    listing: tuple[str, int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, line, statements = listing
    monkeypatch.delenv("TXN_OFFSETS_DATABASE_URL", raising=False)  # printing needs no database
    text = "\n".join(statements)
    role = re.search(r' TO "([^"]+)"', text)
    assert role, f"{doc}:{line}: a GRANT listing without a role"
    argv = ["db", "grants", "--role", role.group(1)]
    argv += [a for t in re.findall(r'ON "([^"]+)"\."([^"]+)" TO', text) for a in ("--table", ".".join(t))]
    job = re.search(r"VALUES \('([^']+)'", text)
    argv += ["--job", job.group(1)] if job else []
    assert statements == _printed(argv), (
        f"{doc}:{line}: the listing differs from `txn-offsets {shlex.join(argv)}`"
    )


def test_the_run_role_is_granted_every_table_it_needs() -> None:
    granted = " ".join(run_role_grants("txn_offsets", "r"))
    # job_owners: run roles get nothing on it, by design (they could give themselves a job)
    missing = sorted(t for t in TABLES - {"job_owners"} if not re.search(rf'"txn_offsets"\.{t}\b', granted))
    assert not missing, f"run_role_grants grants nothing on {missing}"


# -- migrations


def migrations() -> dict[str, set[str]]:
    """revision -> the tables it creates and the table.column it adds."""
    found: dict[str, set[str]] = {}
    for path in sorted(VERSIONS.glob("[0-9]*.py")):
        tree = ast.parse(path.read_text())
        revision = next(
            str(n.value.value)
            for n in tree.body
            if isinstance(n, ast.AnnAssign)
            and getattr(n.target, "id", "") == "revision"
            and isinstance(n.value, ast.Constant)
        )
        upgrade = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade")
        changes = set()
        for node in ast.walk(upgrade):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                first = node.args[0]
                if node.func.attr == "create_table" and isinstance(first, ast.Constant):
                    changes.add(str(first.value))
                if node.func.attr == "add_column" and isinstance(first, ast.Constant):
                    column = node.args[1]
                    assert isinstance(column, ast.Call) and isinstance(column.args[0], ast.Constant)
                    changes.add(f"{first.value!s}.{column.args[0].value!s}")
        found[revision] = changes
    return found


MIGRATIONS = migrations()
HEAD = max(MIGRATIONS)


def test_the_migrations_table_matches_the_versions() -> None:
    section = _section(REPO / "docs" / "store.md", "### Migrations")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\d{4})` \|(.*)$", section, re.MULTILINE)}
    assert set(rows) == set(MIGRATIONS), (
        f"docs/store.md's migrations table lists {sorted(rows)}, the versions {sorted(MIGRATIONS)}"
    )
    for revision, changes in MIGRATIONS.items():
        named = {n for n in re.findall(r"`([\w.]+)`", rows[revision]) if n.split(".")[0] in TABLES}
        assert named == changes, (
            f"docs/store.md: migration {revision} creates/adds {sorted(changes)}, "
            f"the row says {sorted(named)}"
        )


def revision_mentions() -> list[tuple[str, int, str, str]]:
    """(doc, line, revision, the text around it) for each 4-digit revision number in the docs."""
    pattern = re.compile(r"(?:revision|migration|head|to) (0\d{3})\b|`(0\d{3})`|#\s*(0\d{3}):")
    found = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in pattern.finditer(line):
                found.append((str(path.relative_to(REPO)), number, next(g for g in m.groups() if g), line))
    return found


def test_revision_numbers_in_the_docs_exist() -> None:
    mentions = revision_mentions()
    assert any(r == "0006" for _, _, r, _ in mentions)
    for doc, line, revision, text in mentions:
        assert revision in MIGRATIONS, f"{doc}:{line}: revision {revision} does not exist: {text.strip()}"
        if "(head)" in text:
            assert revision == HEAD, f"{doc}:{line}: says {revision} is head, head is {HEAD}"


# -- environment variables


def variables_read(root: Path) -> set[str]:
    """The TXN_OFFSETS_* names written as whole strings in `root`'s code: what it reads from the
    environment (and names in its messages)."""
    names = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"TXN_OFFSETS_[A-Z0-9_]+", node.value)
                and node.value != "TXN_OFFSETS_KAFKA"  # a prefix the TLS test builds names from
            ):
                names.add(node.value)
    return names


def variables_written() -> set[str]:
    """What the local stack writes to .stack/env."""
    text = "\n".join(p.read_text() for p in (REPO / "txn_offsets" / "devstack").rglob("*.py"))
    return set(re.findall(r'f"(TXN_OFFSETS_[A-Z0-9_]+)=', text))


def _env_table(heading: str) -> set[str]:
    rows = re.findall(
        r"^\| (`TXN_OFFSETS_.*?) \|", _section(REPO / "docs" / "configuration.md", heading), re.M
    )
    return {name for cell in rows for name in re.findall(r"TXN_OFFSETS_[A-Z0-9_]+", cell)}


def test_the_env_table_lists_what_the_code_reads() -> None:
    code = variables_read(REPO / "txn_offsets")
    assert {"TXN_OFFSETS_DATABASE_URL", "TXN_OFFSETS_SERVE_TOKEN", "TXN_OFFSETS_ROLE_PASSWORD"} <= code
    listed = _env_table("## Environment variables")
    assert listed == code, (
        f"docs/configuration.md's environment table: missing {sorted(code - listed)}, "
        f"read by no code {sorted(listed - code)}"
    )


def test_the_stack_and_test_variables_are_listed() -> None:
    expected = (variables_written() | variables_read(REPO / "tests")) - variables_read(REPO / "txn_offsets")
    assert {"TXN_OFFSETS_ADMIN_DATABASE_URL", "TXN_OFFSETS_TEST_DOCKER"} <= expected
    listed = _env_table("### Written by the local stack, read by the tests")
    assert listed == expected, (
        f"docs/configuration.md: missing {sorted(expected - listed)}, not used {sorted(listed - expected)}"
    )


# -- version floors


def _floor(requirement: str) -> str:
    match = re.search(r">=\s*([\d.]+)", requirement)
    assert match, requirement
    return match.group(1)


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
PYSPARK = _floor(next(d for d in PYPROJECT["dependencies"] if d.startswith("pyspark")))
PYTHON = _floor(PYPROJECT["requires-python"])


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_the_readme_states_the_floors_of_pyproject() -> None:
    needs = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("Needs:"))
    assert f"Python >= {PYTHON}" in needs, f"README.md's 'Needs:' line: Python >= {PYTHON} (pyproject.toml)"
    assert f"pyspark >= {PYSPARK}" in needs, (
        f"README.md's 'Needs:' line: pyspark >= {PYSPARK} (pyproject.toml)"
    )


def test_no_doc_states_another_pyspark_dependency() -> None:
    for path in DOCS:
        text = " ".join(path.read_text().split())
        for m in re.finditer(r"pyspark\s*>=\s*([\d.]+)", text, re.IGNORECASE):
            # a feature may need more than the package's floor, never less
            assert _version(m.group(1)) >= _version(PYSPARK), (
                f"{path.name}: {m.group(0)} is below pyproject's {PYSPARK}"
            )
        depends = re.search(r"(?:project|package) (?:depends on|requires) (?:pyspark )?([\d.]+)", text)
        assert not depends or depends.group(1) == PYSPARK, (
            f"{path.name}: '{depends.group(0)}' (pyproject: >= {PYSPARK})"
        )


# -- the Dockerfile


DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_the_dockerfile_names_no_architecture() -> None:
    for arch in ("amd64", "arm64", "x86_64", "aarch64", "i386", "ppc64el", "s390x"):
        assert arch not in DOCKERFILE, f"Dockerfile names {arch}: it builds on every architecture"


def test_the_dockerfile_derives_java_home(tmp_path: Path) -> None:
    env = re.search(r"^ENV JAVA_HOME=(\S+)", DOCKERFILE, re.MULTILINE)
    assert env, "Dockerfile sets no JAVA_HOME"
    link = re.search(r'ln -s[fn]* ("\$\(.*\)") ' + re.escape(env.group(1)), DOCKERFILE)
    assert link, f"Dockerfile: JAVA_HOME={env.group(1)} is not linked from the installed java"
    # the derivation, on a JDK laid out as Debian does for another architecture
    jdk = tmp_path / "usr/lib/jvm/java-17-openjdk-riscv64"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\n")
    (jdk / "bin" / "java").chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").symlink_to(jdk / "bin" / "java")  # what update-alternatives leaves
    home = subprocess.run(
        ["/bin/sh", "-c", f"echo {link.group(1)}"],
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(home) == jdk


# -- the streaming checkpoint path


def test_the_documented_checkpoint_path_is_the_one_used() -> None:
    from types import SimpleNamespace

    from txn_offsets.spark.stream.query import TxnStream

    fake = SimpleNamespace(
        run=SimpleNamespace(job="j", generation=3, run_id="r1"),
        config=SimpleNamespace(database=SimpleNamespace(schema="s")),
        _checkpoint_root="/root",
    )
    used = TxnStream.checkpoint_location.fget(fake)  # type: ignore[attr-defined]
    found = 0
    for path in DOCS:
        for m in re.finditer(r"`(<checkpoint_root>/[^`]+)`", path.read_text()):
            found += 1
            parts = re.split(r"(<[^>]+>)", m.group(1))
            pattern = "".join(
                ".+" if p == "<checkpoint_root>" else "[^/-]+" if p.startswith("<") else re.escape(p)
                for p in parts
            )
            assert re.fullmatch(pattern, used), (
                f"{path.name}: {m.group(1)} is not how the path is made: {used}"
            )
    assert found >= 2


def test_store_md_names_every_column() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \|(.*)$", _section(REPO / "docs" / "store.md", "## Tables"), re.M)
    }
    for table in metadata_for().tables.values():
        if table.name in rows:
            named = {
                w for span in re.findall(r"`([^`]+)`", rows[table.name]) for w in re.findall(r"\w+", span)
            }
            missing = sorted(c.name for c in table.columns if c.name not in named)
            assert not missing, f"docs/store.md: the row of {table.name} does not name the columns {missing}"
