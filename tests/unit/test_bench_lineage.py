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
    assert lineage.line(s).startswith("bench: lineage_cost_pct=3.00 ")
    assert lineage.line(lineage.summary([])) == (
        "bench: lineage_cost_pct=nan lineage_pair_iqr_pct=nan lineage_claim_cost_pct=nan"
    )
    where = {"finished_at": "now", "point": "p8-c1000", "messages": 9, "cap": 1}
    md = lineage.markdown({"lineage": s | where})
    assert len(md) == 2 and "+3.0 % end to end" in md[0] and "97, 20, 200" in md[0]
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


def _timed(on: bool, rps: float, seconds: float, rows: int) -> dict[str, object]:
    return {"lineage": on, "label": "warm", "records_per_s": rps, "seconds": seconds, "commit_rows": rows}


def test_the_pairs_spread_and_the_claims_cost_measured_directly() -> None:
    """Each round's pair (runs 2k, 2k+1 of the warm runs, in run order) gives one with/without
    ratio; their interquartile range is the noise. The direct figure: the claim's extra ms per range
    x the ranges an on-run committed, over the median off-run's seconds."""
    runs = [
        _run(True, "first", 1.0),
        _run(False, "first", 1.0),
        _timed(False, 100.0, 10.0, 0),
        _timed(True, 90.0, 11.0, 400),  # pair 1: -10 % rec/s -> cost +10
        _timed(True, 100.0, 10.0, 400),
        _timed(False, 100.0, 10.0, 0),  # pair 2: 0
        _timed(False, 100.0, 8.0, 0),
        _timed(True, 105.0, 9.0, 400),  # pair 3: -5
    ]
    claims = {"on_ms_per_range": 1.25, "off_ms_per_range": 1.0, "ranges_per_transaction": 4}
    s = lineage.summary(runs, claims | {"transactions": 300, "blocks": 6})
    assert s["pair_pcts"] == pytest.approx([10.0, 0.0, -5.0])
    assert s["pair_iqr_pct"] == pytest.approx(7.5)  # quartiles -2.5 and 5 (inclusive method)
    # 0.25 ms x 400 ranges = 0.1 s over the median off-run's 10 s
    assert s["claim_cost_pct"] == pytest.approx(1.0)
    assert lineage.line(s) == (
        f"bench: lineage_cost_pct={s['cost_pct']:.2f} lineage_pair_iqr_pct=7.50 lineage_claim_cost_pct=1.00"
    )
    where = {"finished_at": "now", "point": "p8-c1000", "messages": 9, "cap": 1}
    md = lineage.markdown({"lineage": s | where})[0]
    assert "1.250 ms per range with the lineage, 1.000 without" in md and "**1.00 %**" in md
    # a claim that came out cheaper with the lineage (noise) costs 0, never a negative share
    s = lineage.summary(runs, claims | {"on_ms_per_range": 0.9})
    assert s["claim_cost_pct"] == 0.0
