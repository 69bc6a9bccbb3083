"""The bench's lineage phase: its run order, its figure and its place among the phases (the run
itself: tests/integration/spark/test_bench_lineage.py, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import lineage, report
from benchmarks.settings import FULL, LINEAGE, PHASES, SMOKE, size_from_env

REPO = Path(__file__).resolve().parents[2]


def test_each_setting_runs_first_then_alternates_which_goes_first() -> None:
    runs = lineage.order(3)
    assert runs[:2] == [(True, "first"), (False, "first")]
    warm = [on for on, label in runs[2:] if label == "warm"]
    assert warm == [False, True, True, False, False, True]  # off-on, on-off, off-on
    assert warm.count(True) == warm.count(False) == 3


def _run(on: bool, label: str, rps: float) -> dict[str, object]:
    return {"lineage": on, "label": label, "records_per_s": rps}


def test_the_cost_is_the_median_warm_rate_with_over_without() -> None:
    runs = [
        _run(True, "first", 10.0),  # first runs never count
        _run(False, "first", 1000.0),
        *(_run(False, "warm", r) for r in (100.0, 120.0, 80.0)),
        *(_run(True, "warm", r) for r in (97.0, 20.0, 200.0)),
    ]
    s = lineage.summary(runs)
    assert (s["on_rps"], s["off_rps"], s["warm_runs"]) == (97.0, 100.0, 3)
    assert s["cost_pct"] == pytest.approx(3.0)
    assert lineage.line(s) == "bench: lineage_cost_pct=3.00"
    assert lineage.line(lineage.summary([])) == "bench: lineage_cost_pct=nan"
    where = {"finished_at": "now", "point": "p8-c1000", "messages": 9, "cap": 1}
    md = lineage.markdown({"lineage": s | where})
    assert len(md) == 2 and "**+3.0 %**" in md[0] and "97, 20, 200" in md[0]
    assert lineage.markdown({"lineage": {}}) == [] and lineage.markdown({}) == []
    # docs/benchmarks.md's block: the paragraph when the result has the phase (an older JSON has not)
    saved = json.loads((REPO / "benchmarks" / "results" / "full.json").read_text())
    saved.pop("lineage", None)
    assert "Lineage cost" not in report.markdown(saved, None)
    saved["lineage"] = s | where
    assert md[0] in report.markdown(saved, None)


def test_the_phase_is_part_of_the_full_bench_not_of_the_smoke(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LINEAGE in PHASES and LINEAGE in FULL.phases and LINEAGE not in SMOKE.phases
    monkeypatch.setenv("BENCH_PHASES", "lineage")
    monkeypatch.setenv("BENCH_LINEAGE_RUNS", "4")
    size = size_from_env("full")
    assert size.phases == ("lineage",) and size.lineage_runs == 4
    assert size.headline(size.small_cap).name == "p8-c1000"  # the point it runs at
