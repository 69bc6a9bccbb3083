"""The reference docs keep up with the code: every public error has a troubleshooting section, and
every run_job keyword appears in the configuration reference."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import txn_offsets
from txn_offsets import run_job

DOCS = Path(__file__).resolve().parents[2] / "docs"

ERRORS = sorted(
    name
    for name in txn_offsets.__all__
    if isinstance(getattr(txn_offsets, name), type) and issubclass(getattr(txn_offsets, name), BaseException)
)
KEYWORDS = [
    p.name for p in inspect.signature(run_job).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
]


def test_the_lists_are_not_empty() -> None:
    # a guard that silently checks nothing is worse than none
    assert "TxnOffsetsError" in ERRORS and "OffsetConflict" in ERRORS
    assert {"job", "writer", "on_data_loss"} <= set(KEYWORDS)


@pytest.mark.parametrize("name", ERRORS)
def test_every_public_error_has_a_troubleshooting_section(name: str) -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    assert re.search(rf"^## `{name}`\s*$", text, re.MULTILINE), (
        f"docs/troubleshooting.md has no '## `{name}`' section (cause, fix and an example message)"
    )


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_every_run_job_keyword_is_in_the_configuration_reference(keyword: str) -> None:
    text = (DOCS / "configuration.md").read_text()
    assert re.search(rf"^\| `{keyword}` \|", text, re.MULTILINE), (
        f"docs/configuration.md has no table row for run_job's `{keyword}` (default and analogue)"
    )


def test_the_protocol_lists_exactly_the_transient_errors() -> None:
    from txn_offsets.errors.base import Transient

    transient = {name for name in ERRORS if issubclass(getattr(txn_offsets, name), Transient)} - {"Transient"}
    text = (DOCS / "protocol.md").read_text()
    heading = text.index("### Between batches")
    section = text[text.index("\n", heading) :]
    paragraph = section[: section.index("are transient")]
    listed = set(re.findall(r"`(\w+)`", paragraph))
    assert listed == transient, (
        f"docs/protocol.md's transient errors: missing {sorted(transient - listed)}, "
        f"not transient {sorted(listed - transient)}"
    )
