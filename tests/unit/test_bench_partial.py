"""A run of some phases only updates its own sections of the saved full run (benchmarks/partial.py)."""

from __future__ import annotations

from benchmarks import partial
from benchmarks.settings import LINEAGE, PHASES, SWEEP


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


def test_a_sweep_run_takes_its_own_points_with_its_runs() -> None:
    """The sweep's points name the topics its runs read (the reader limits are matched to a point
    by topic): a sweep-only run must bring them along, or reader_vs_raw finds no reader run (nan)."""
    old_point = {"name": "p8-c40000", "topic": "bench-old"}
    new_point = {"name": "p8-c40000", "topic": "bench-new"}
    saved = {
        "meta": {"finished_at": "then", "points": [old_point], "headline_points": ["a", "b"]},
        "runs": [1],
    }
    new = {"meta": {"finished_at": "now", "points": [new_point], "headline_points": ["c", "d"]}, "runs": [2]}
    merged = partial.merge(saved, new, (SWEEP,))
    assert merged["runs"] == [2] and merged["meta"]["points"] == [new_point]
    assert merged["meta"]["headline_points"] == ["c", "d"] and merged["meta"]["finished_at"] == "then"
    assert partial.merge(saved, new, (LINEAGE,))["meta"]["points"] == [old_point]  # another phase's run
