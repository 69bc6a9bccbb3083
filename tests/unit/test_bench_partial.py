"""A run of some phases only updates its own sections of the saved full run (benchmarks/partial.py)."""

from __future__ import annotations

from benchmarks import partial
from benchmarks.settings import LINEAGE, PHASES


def test_a_phase_run_replaces_only_its_own_sections() -> None:
    saved = {"meta": {"finished_at": "then"}, "runs": [1], "latency": [2], "lineage": {"cost_pct": 9.0}}
    new = {"meta": {"finished_at": "now"}, "runs": [], "latency": [], "lineage": {"cost_pct": 1.0}}
    merged = partial.merge(saved, new, (LINEAGE,))
    assert merged["runs"] == [1] and merged["latency"] == [2]  # the sweep's, untouched
    assert merged["lineage"] == {"cost_pct": 1.0}
    assert merged["meta"]["finished_at"] == "then"
    assert merged["meta"]["partial_runs"] == [{"phases": ["lineage"], "finished_at": "now"}]
    assert saved["lineage"] == {"cost_pct": 9.0} and "partial_runs" not in saved["meta"]  # not mutated


def test_every_phase_owns_sections_and_only_a_subset_is_partial() -> None:
    assert set(partial.OWNED) == set(PHASES)
    assert partial.is_partial((LINEAGE,)) and not partial.is_partial(PHASES)
