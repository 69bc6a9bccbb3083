"""The bench's latency phase without running it: BENCH_PHASES=latency selects it alone, the smoke
size leaves it out by default, and its last-lines row says n/a for what did not run (the
low-latency mode has no entry point yet) and the figures of what did."""

from __future__ import annotations

import pytest

from benchmarks import report
from benchmarks.settings import (
    EO_LOW_LATENCY,
    EO_PARTITION,
    LATENCY,
    LATENCY_FOLLOWERS,
    RTM_ALO,
    RTM_EO,
    SSS,
    size_from_env,
)


def test_bench_phases_latency_runs_that_phase_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_PHASES", "latency")
    assert size_from_env("smoke").phases == (LATENCY,)
    assert size_from_env("full").phases == (LATENCY,)
    monkeypatch.delenv("BENCH_PHASES")
    assert LATENCY in size_from_env("full").phases
    assert LATENCY not in size_from_env("smoke").phases  # make test's smoke stays as long as it was
    assert LATENCY_FOLLOWERS == (EO_PARTITION, EO_LOW_LATENCY, SSS, RTM_ALO, RTM_EO)


def _probe(contender: str, p50: float, p99: float) -> dict[str, object]:
    return {
        "contender": contender,
        "rate": 2000,
        "topic_partitions": 8,
        "seconds": 60.0,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": p99 + 1,
        "peak_rss_mb": 900.0,
        "poll_ms": 5.0,
        "probe_polls": 11000,
        "probe_poll_ms_mean": 0.41,
        "probe_cpu_share": 0.052,
    }


def test_the_latency_row_and_table() -> None:
    result = {
        "latency_phase": [
            _probe(EO_PARTITION, 270.0, 478.25),
            {"contender": EO_LOW_LATENCY, "p50_ms": None, "p99_ms": None},
            _probe(SSS, 1195.0, 2719.5),
            _probe(RTM_ALO, 3000.0, 9000.0),
            _probe(RTM_EO, 3100.0, 9100.04),
        ],
        "low_latency_throughput_vs_batch": None,
    }
    line = report.latency_line(report.latency_figures(result))
    assert line == (
        "bench: eo_latency_p50_ms=n/a eo_latency_p99_ms=n/a sss_latency_p99_ms=2719.5 "
        "rtm_latency_p99_ms=9100.0 low_latency_throughput_vs_batch=n/a"
    )
    result["latency_phase"][1] = _probe(EO_LOW_LATENCY, 21.04, 88.0)
    result["low_latency_throughput_vs_batch"] = 0.953
    assert report.latency_line(report.latency_figures(result)) == (
        "bench: eo_latency_p50_ms=21.0 eo_latency_p99_ms=88.0 sss_latency_p99_ms=2719.5 "
        "rtm_latency_p99_ms=9100.0 low_latency_throughput_vs_batch=0.95"
    )
    table = "\n".join(report.latency_phase_markdown(result))
    assert "2,000 records/s over 8 partitions, 60 s" in table and "polled every 5 ms" in table
    assert "| real-time mode, txn_offsets exactly-once sink | 3100.0 | 9100.0 |" in table
    assert "11,000 polls, 0.41 ms each, 5.2 % of a core" in table
    # a run without the phase (the smoke) says n/a everywhere and adds no table
    assert report.latency_line(report.latency_figures({})).count("=n/a") == 5
    assert report.latency_phase_markdown({}) == []


def test_every_latency_follower_runs() -> None:
    from benchmarks import latency, lowlatency

    assert set(latency.RUNNABLE) == set(LATENCY_FOLLOWERS)  # the low-latency mode is no longer n/a
    assert lowlatency.FOLLOW.commit_interval_ms <= 10
    assert lowlatency.options(40_000).commit_max_records == 40_000


def test_the_throughput_runs_alternate_after_a_first_run_of_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.lowlatency import order

    assert order(2) == [
        (EO_PARTITION, "first"),
        (EO_LOW_LATENCY, "first"),
        (EO_LOW_LATENCY, "warm"),
        (EO_PARTITION, "warm"),
        (EO_PARTITION, "warm"),
        (EO_LOW_LATENCY, "warm"),
    ]
    assert size_from_env("full").low_latency_runs == 2
    monkeypatch.setenv("BENCH_LOW_LATENCY_RUNS", "3")
    assert size_from_env("full").low_latency_runs == 3


def _run(contender: str, label: str, rate: float) -> dict[str, object]:
    return {"contender": contender, "label": label, "records_per_s": rate}


def test_the_throughput_ratio_is_best_warm_over_best_warm() -> None:
    from benchmarks.lowlatency import throughput_ratio

    runs = [
        _run(EO_PARTITION, "first", 10_000.0),  # the first runs never count
        _run(EO_LOW_LATENCY, "first", 99_000.0),
        _run(EO_LOW_LATENCY, "warm", 45_000.0),
        _run(EO_PARTITION, "warm", 50_000.0),
        _run(EO_PARTITION, "warm", 60_000.0),
        _run(EO_LOW_LATENCY, "warm", 57_000.0),
    ]
    found = throughput_ratio(runs)
    assert found["ratio"] == pytest.approx(57_000 / 60_000)
    assert found["median_round_ratio"] == pytest.approx((45 / 50 + 57 / 60) / 2)
    assert found["runs"] == 4
    # only first runs, or only one side: no ratio (the row says n/a)
    assert throughput_ratio(runs[:2])["ratio"] is None
    assert throughput_ratio([r for r in runs if r["contender"] == EO_PARTITION])["ratio"] is None
    assert throughput_ratio([])["ratio"] is None


def test_the_throughput_sentence_under_the_latency_table() -> None:
    from benchmarks.lowlatency import throughput_ratio

    runs = [_run(EO_PARTITION, "warm", 80_000.0), _run(EO_LOW_LATENCY, "warm", 76_000.0)]
    result = {
        "latency_phase": [_probe(EO_LOW_LATENCY, 21.0, 88.0)],
        "low_latency_throughput": throughput_ratio(runs),
    }
    table = "\n".join(report.latency_phase_markdown(result))
    assert "low-latency mode 76,000 records/s, batch mode 80,000 records/s (best runs): **0.95**" in table
    result["low_latency_throughput"] = throughput_ratio([])
    assert "records/s (best runs)" not in "\n".join(report.latency_phase_markdown(result))
