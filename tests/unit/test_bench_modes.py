"""The modes phase's fields (benchmarks/modes.py): each mode over its reference as the median of the
warm rounds' ratios with their spread, at both caps, printed on the last line (nan without the phase)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import modes, report
from benchmarks.settings import (
    ALO,
    EO_BATCH,
    EO_BATCH_MERGED,
    EO_CONNECT,
    EO_PARTITION,
    EO_STREAM,
    SSS,
    Point,
    size_from_env,
)
from benchmarks.worker import WorkerFailed


def run(contender: str, cap: str, round_: int, rps: float, cpu: float = 0.1) -> dict[str, Any]:
    label = modes.FIRST if round_ == 0 else modes.WARM
    return {
        "contender": contender,
        "cap": cap,
        "round": round_,
        "label": label,
        "records_per_s": rps,
        "cpu_s_per_1k": cpu,
    }


@given(st.integers(min_value=1, max_value=7), st.integers(min_value=1, max_value=3))
def test_every_round_runs_every_contender_once_and_no_one_is_always_first(rounds: int, warmup: int) -> None:
    planned = modes.order(modes.CONTENDERS, rounds, warmup)
    assert len(planned) == len(modes.CONTENDERS) * (warmup + rounds)
    assert [r for r, _ in planned] == sorted(r for r, _ in planned)  # round after round
    for k in range(warmup + rounds):
        assert sorted(c for r, c in planned if r == k) == sorted(modes.CONTENDERS)
    measured = range(warmup, warmup + rounds)
    firsts = {next(c for r, c in planned if r == k) for k in measured}
    assert rounds < 2 or len(firsts) > 1


def test_the_warm_up_rounds_are_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_MODES_WARMUP", "2")
    monkeypatch.setenv("BENCH_MODES_ROUNDS", "3")
    size = size_from_env("full")
    assert (size.modes_warmup, size.modes_rounds) == (2, 3)
    # round 0 and 1 warm up: a slow eo in round 1 does not move the field
    runs = [run(c, cap, 0, 1.0) for c in modes.CONTENDERS for cap in modes.CAPS]
    runs += [
        run(EO_PARTITION, "small", 1, 10.0) | {"label": modes.FIRST},
        run(ALO, "small", 1, 100.0) | {"label": modes.FIRST},
    ]
    for k in (2, 3, 4):
        runs += [run(EO_PARTITION, "small", k, 95.0), run(ALO, "small", k, 100.0)]
    assert modes.fields({"runs": runs})["eo_vs_alo_small"] == 0.95


def test_the_fields_are_medians_of_the_warm_rounds_with_their_spread() -> None:
    runs = [run(c, cap, 0, 1.0) for c in modes.CONTENDERS for cap in modes.CAPS]  # first runs: not counted
    eo_alo = {1: (90.0, 100.0), 2: (99.0, 100.0), 3: (100.0, 95.0), 4: (80.0, 100.0), 5: (97.0, 100.0)}
    for k, (eo, alo) in eo_alo.items():
        for cap in modes.CAPS:
            runs += [run(EO_PARTITION, cap, k, eo, cpu=0.2), run(ALO, cap, k, alo, cpu=0.1)]
            runs += [run(EO_CONNECT, cap, k, eo * 0.5), run(EO_BATCH, cap, k, eo * 0.8)]
            runs += [run(EO_BATCH_MERGED, cap, k, eo * 0.96)]
    runs += [run(EO_STREAM, "small", 1, 30.0), run(SSS, "small", 1, 20.0)]
    found = modes.fields({"runs": runs})
    assert found["eo_vs_alo_small"] == 0.97  # ratios 0.90, 0.99, 1.05, 0.80, 0.97: the median
    assert found["connect_vs_rdd_large"] == 0.5 and found["batchwriter_vs_partition_small"] == 0.8
    # the one-stage BatchWriter has a field of its own beside the shuffling one
    assert found["batchwriter_merged_vs_partition_small"] == 0.96
    assert found["stream_vs_sss_small"] == 1.5 and found["stream_vs_sss_large"] is None
    assert found["frame_vs_rdd_small"] is None  # eo_frame had no warm round
    assert modes.spreads({"runs": runs})["eo_vs_alo_large"] == (0.8, 100.0 / 95.0)
    cpu = modes.summary(runs)["cpu_ratios"]["eo_vs_alo_small"]
    assert cpu["median"] == 0.5  # alo's CPU over eo's: eo costs twice the CPU
    line = modes.line({"runs": runs})
    assert "eo_vs_alo_small=0.97 " in line and "eo_vs_alo_large_spread=0.80-1.05" in line
    assert "stream_vs_sss_large=nan" in line


def test_the_last_line_carries_the_fields_nan_without_the_phase() -> None:
    ratios: dict[str, float | None] = dict.fromkeys(report.HEADLINE_KEYS, 1.0)
    last = report.final_line(ratios, {"modes": {}})
    names = re.findall(r"(\w+)=", last)
    assert names[: len(report.HEADLINE_KEYS)] == list(report.HEADLINE_KEYS)
    expected = [f"{n}_{c}" for n in modes.PAIRS for c in modes.CAPS]
    assert names[len(report.HEADLINE_KEYS) :] == [
        *expected,
        "eo_vs_alo_small_spread",
        "eo_vs_alo_large_spread",
    ]
    assert last.endswith("eo_vs_alo_small_spread=nan eo_vs_alo_large_spread=nan")


class FlakyWorker:
    """A worker whose first `fails` runs end as Spark's connect-back timeout, or with `error`."""

    def __init__(self, fails: int, error: str = "Python worker failed to connect back.") -> None:
        self.fails, self.error = fails, error
        self.calls: list[str] = []

    def call(self, op: str, **_args: Any) -> dict[str, Any]:
        self.calls.append(op)
        if op == "run" and self.calls.count("run") <= self.fails:
            raise WorkerFailed(f"eo_stream: StreamingQueryException: {self.error}")
        return {"records_per_s": 1.0} if op == "run" else {}


def test_a_run_spark_could_not_start_is_run_again_a_bounded_number_of_times() -> None:
    point = Point(8, 1_000, 100)
    worker = FlakyWorker(fails=2)
    assert modes._run(worker, point, None, modes.WARM, EO_STREAM) == {"records_per_s": 1.0}
    assert worker.calls == ["warm", "run"] * 3  # warmed before every attempt
    with pytest.raises(WorkerFailed, match="connect back"):
        modes._run(FlakyWorker(fails=modes.RETRIES + 1), point, None, modes.WARM, EO_STREAM)
    other = FlakyWorker(fails=1, error="wrong result")
    with pytest.raises(WorkerFailed, match="wrong result"):  # any other failure: at once
        modes._run(other, point, None, modes.WARM, EO_STREAM)
    assert other.calls == ["warm", "run"]
