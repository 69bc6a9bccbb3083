"""The scale phase's last-lines row at the full sizes: its keys in the issue's order, the ratios
from the warm per-batch p50s, the plan in whole ms, the jobs' exactness and connections vs budget."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from benchmarks import report, scale
from benchmarks.settings import FULL_MORE


def _stats(p50: float) -> dict[str, Any]:
    return {"interval_p50_s": p50}


def result(exact: bool = True, small_exact: bool = True) -> dict[str, Any]:
    at = {"updates": 80_000, "hot_updates": 79_000, "hot_ratio": 0.9875, "total_bytes": 65_536}
    checkpoints = [{**at, "batches": 100}, {**at, "batches": 10_000}]
    jobs: dict[str, Any] = {
        "jobs": 32,
        "many_vs_one": 0.93,
        "exact": exact,
        "peak_connections": 71,
        "budget": 104,
    }
    jobs.update(records=20_000, batch_records=5_000, runs=[], lock_waits=0)
    small = {**jobs, "many_vs_one": 0.41, "exact": small_exact, "peak_connections": 80}
    small.update(records=2_000, batch_records=500)
    return {
        "scale": {
            "partitions": [8, 128],
            "ratio_label": "warm",
            "warm": {"8": _stats(0.4), "128": _stats(0.6), "1024": _stats(1.0), "4096": _stats(1.9)},
            "more": {
                "settings": asdict(FULL_MORE),
                "plan": {
                    "partitions": 4096,
                    "p50_ms": 123.4,
                    "plans": 20,
                    "max_ms": 200.0,
                    "first_ms": 900.0,
                },
                "hot": {
                    "partitions": 8,
                    "checkpoints": checkpoints,
                    "hot_ratio": 0.9875,
                    "total_ratio": 1.0,
                    "waited_s": 0.5,
                    "oldest_transaction_max_s": 2.5,
                },
                "jobs": {**jobs, "small": small},
            },
        }
    }


def test_the_row_names_every_figure_of_the_issue() -> None:
    assert scale.line(result()) == (
        "bench: per_batch_1024_vs_8=2.50 per_batch_4096_vs_8=4.75 plan_4096_p50_ms=123 hot_ratio=0.99 "
        "jobs32_vs_1=0.93 jobs32_exact=yes peak_connections=80/104"
    )  # exact and peak connections over both workloads; the ratio is the main one's
    assert "jobs32_exact=no" in (scale.line(result(exact=False)) or "")
    assert "jobs32_exact=no" in (scale.line(result(small_exact=False)) or "")


def test_no_row_without_the_extension_and_nan_for_a_count_not_timed() -> None:
    assert scale.line({"scale": {}}) is None
    missing = result()
    del missing["scale"]["warm"]["4096"]
    assert "per_batch_4096_vs_8=nan" in (scale.line(missing) or "")


def test_the_markdown_shows_the_figures() -> None:
    text = "\n".join(scale.markdown(result()))
    assert "p50 **123 ms**" in text and "**0.988**" in text and "**0.93x**" in text
    assert "oldest other open transaction during the batches: 2.5 s" in text and "waited 0.5 s" in text
    assert "20,000 records each in batches of 5,000" in text and "(batches of 160,000)" in text
    assert "2,000 records each in batches of 500" in text and "**0.41x**" in text
    assert scale.markdown({"scale": {}}) == [] and report.scale_rows({"scale": {}}) == []


def test_the_readme_shaped_job_is_beside_the_bench_s_own() -> None:
    shown = result()
    # round 0: the first runs; then rounds alternating, each run next to the other of its round
    runs = [
        (0, 8, 0.5),
        (0, 4096, 3.0),
        (1, 4096, 2.0),
        (1, 8, 0.4),
        (2, 8, 0.5),
        (2, 4096, 2.5),
        (3, 4096, 1.8),
        (3, 8, 0.6),
    ]
    shown["scale"]["user"] = [
        {"partitions": n, "round": k, "label": "warm" if k else "first", "interval_p50_s": p50}
        for k, n, p50 in runs
    ]
    line = scale.line(shown) or ""
    # the warm rounds' ratios 5.0, 5.0 and 3.0: their median, then their range
    assert (
        "per_batch_4096_vs_8=4.75 user_per_batch_4096_vs_8=5.00 user_per_batch_4096_vs_8_spread=3.00-5.00 "
        "plan_4096_p50_ms=123" in line
    )
    assert scale.user_ratio([{"partitions": 8, "round": 0, "label": "first", "interval_p50_s": 0.5}]) is None
    for run in shown["scale"]["user"]:
        run["ranges_p50"] = min(run["partitions"], 8_000)
    text = "\n".join(scale.markdown(shown))
    assert "4,096 warm 2.000 s (4,096 ranges)" in text
    assert "warm over warm **5.00x** (the rounds' ratios 3.00-5.00)" in text


def test_the_first_runs_give_the_ratio_when_no_round_is_warm() -> None:
    first = [
        {"partitions": 8, "round": 0, "label": "first", "interval_p50_s": 0.5},
        {"partitions": 4096, "round": 0, "label": "first", "interval_p50_s": 3.0},
    ]
    assert scale.user_ratio(first) == 6.0 and scale.user_spread(first) == (6.0, 6.0)
    shown = result()
    shown["scale"]["user"] = first
    assert "user_per_batch_4096_vs_8=6.00 user_per_batch_4096_vs_8_spread=6.00-6.00" in (
        scale.line(shown) or ""
    )


def test_runs_recorded_without_their_round_keep_the_ratio_of_medians() -> None:
    # results written before runs carried their round: the warm runs' median p50s, one over the other
    runs = [(8, "first", 0.5), (4096, "first", 3.0), (4096, "warm", 2.0), (8, "warm", 0.4), (8, "warm", 0.6)]
    old = [{"partitions": n, "label": label, "interval_p50_s": p50} for n, label, p50 in runs]
    assert scale.user_ratio(old) == 4.0 and scale.user_spread(old) is None
    shown = result()
    shown["scale"]["user"] = old
    assert "user_per_batch_4096_vs_8=4.00 user_per_batch_4096_vs_8_spread=nan" in (scale.line(shown) or "")
