"""``make bench`` at BENCH_SIZE=smoke, as a subprocess: every contender's result is checked against
the oracle inside the benchmark (a wrong count exits non-zero); here we check that it measured every
contender (the DataFrame path among them) at every point, fresh and warm, ran both latency probes,
the scale phase (per-batch times at 8 and 128 partitions; plans at 128, batches of claims, 2 jobs on
threads vs one job, each exact, no lock waits between them) and the memory phase (Python workers' RSS
sampled over many batches), wrote its JSON and plot, and ended with the findings and ratio lines.
No timing is asserted: performance claims come from ``make bench``.

``make test`` runs it at one point count (8 partitions), with txn_offsets' PartitionWriter and the
limits, the sweep and scale phases (about a third of the time: the Structured Streaming contender,
the at-least-once baseline and the memory phase cost a Spark application each - 2026-11-28, idle:
112 s with the baseline, ~30 s of it the baseline's own JVM; their three ratios print nan); the
smoke size as it is (1 and 8 partitions, every contender, 40 memory batches) is marked slow."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from benchmarks import modes
from benchmarks.settings import (
    FOLLOWERS,
    LIMIT_CONTENDERS,
    READER_SLOTS,
    READERS,
    SPARK_CONTENDERS,
    SPARK_TASK_SLOTS,
)
from tests.fix_services import Services, run_module

FINDINGS = re.compile(
    r"^bench: per_batch_128_vs_8=(?P<ratio>\S+) workers_rss_growth_mb=(?P<mb>\S+) "
    r"workers_rss_growth_pct=(?P<pct>\S+) reader_vs_raw_1proc_per_slot=(?P<slot>\S+)$"
)
# the scale phase's row at the smoke's sizes: 128 partitions vs 8, plans at 128, 2 jobs
SCALE = re.compile(
    r"^bench: per_batch_128_vs_8=(?P<many>\S+) user_per_batch_128_vs_8=(?P<user>\S+) "
    r"user_per_batch_128_vs_8_spread=(?P<user_lo>[0-9.]+)-(?P<user_hi>[0-9.]+) "
    r"plan_128_p50_ms=(?P<plan>\S+) hot_ratio=(?P<hot>\S+) "
    r"jobs2_vs_1=(?P<jobs>\S+) jobs2_exact=(?P<exact>yes|no) peak_connections=(?P<peak>\d+)/(?P<budget>\d+)$"
)
FINAL = re.compile(
    r"^bench: eo_vs_sss_small=(?P<a>\S+) eo_vs_sss_large=(?P<b>\S+) eo_vs_alo=(?P<c>\S+) "
    r"reader_vs_raw=(?P<d>\S+) writes_vs_copy=(?P<e>\S+) (?P<modes>connect_vs_rdd_small=.*)$"
)


# the smoke size at one point count and a short latency probe, the sweep and scale phases, with the
# contenders of the last line's ratios but Structured Streaming and at-least-once (their ratios are
# n/a here; the DataFrame path, BatchWriter and the streaming adapter have integration tests of their
# own; the slow variant runs every contender and the memory phase)
ONE_POINT = {
    "BENCH_PARTITIONS": "8",
    "BENCH_LATENCY_SECONDS": "2",
    "BENCH_PHASES": "sweep,scale",
    "BENCH_CONTENDERS": "eo_partition,reader,reader_slots,upsert,copy_merge",
}
#: the last line's ratios against a contender the one-point smoke leaves out (nan without it)
AGAINST = {"eo_vs_sss_small": "sss", "eo_vs_sss_large": "sss", "eo_vs_alo": "alo"}


@pytest.mark.parametrize(
    "knobs", [pytest.param(ONE_POINT, id="p8"), pytest.param({}, id="smoke", marks=pytest.mark.slow)]
)
def test_bench_smoke(knobs: dict[str, str], services: Services, tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    env = services.environ() | {"BENCH_SIZE": "smoke"}
    for knob in (
        "BENCH_MESSAGES",
        "BENCH_PARTITIONS",
        "BENCH_REPEAT",
        "BENCH_MAX_BATCHES",
        "BENCH_PHASES",
        "BENCH_CONTENDERS",
        "BENCH_SCALE_RECORDS",
        "BENCH_MEMORY_BATCHES",
    ):
        env.pop(knob, None)
    env.update(knobs)
    partitions = {int(p) for p in knobs.get("BENCH_PARTITIONS", "1,8").split(",")}
    memory_batches = int(knobs.get("BENCH_MEMORY_BATCHES", "40"))
    done = run_module("benchmarks.bench", "--out", str(out), "--no-docs", env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    *_, scale_line, before_last, last = done.stdout.strip().splitlines()
    every = (*SPARK_CONTENDERS, *LIMIT_CONTENDERS)
    contenders = knobs["BENCH_CONTENDERS"].split(",") if "BENCH_CONTENDERS" in knobs else every
    with_memory = "memory" in knobs.get("BENCH_PHASES", "memory")
    match = FINAL.match(last)
    assert match, f"unexpected last line: {last!r}"
    ratios = {"a": "eo_vs_sss_small", "b": "eo_vs_sss_large", "c": "eo_vs_alo"}
    # the modes phase's fields (benchmarks/modes.py): not in the smoke's phases, so nan
    shown_modes = dict(field.split("=") for field in match["modes"].split())
    assert set(shown_modes) == set(modes.line(None).replace("=nan", "").split()), last
    assert set(shown_modes.values()) == {"nan"}, last
    for key, value in match.groupdict().items():
        if key == "modes":
            continue
        if AGAINST.get(ratios.get(key, ""), "eo_partition") in contenders:
            assert math.isfinite(float(value)) and float(value) > 0, last
        else:
            assert math.isnan(float(value)), last  # its contender did not run: no ratio
    found = FINDINGS.match(before_last)
    assert found, f"unexpected line before the last: {before_last!r}"
    shown = found.groupdict() if with_memory else {"ratio": found["ratio"], "slot": found["slot"]}
    assert all(math.isfinite(float(v)) for v in shown.values()), before_last
    assert float(found["ratio"]) > 0 and float(found["slot"]) > 0, before_last

    scaled = SCALE.match(scale_line)
    assert scaled, f"unexpected scale row: {scale_line!r}"
    assert float(scaled["many"]) > 0 and float(scaled["plan"]) > 0, scale_line
    assert float(scaled["user"]) > 0, scale_line  # the README-shaped job, exact at both counts
    # its first runs only (no warm round at this size): their one ratio is the whole spread
    assert scaled["user_lo"] == scaled["user"] == scaled["user_hi"], scale_line
    assert 0 < float(scaled["hot"]) <= 1 and float(scaled["jobs"]) > 0, scale_line
    assert scaled["exact"] == "yes" and 0 < int(scaled["peak"]) <= int(scaled["budget"]), scale_line

    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert result["meta"]["size"] == "smoke"
    points = {p["name"] for p in result["meta"]["points"]}
    assert {p["partitions"] for p in result["meta"]["points"]} == partitions
    runs = result["runs"]
    assert {r["contender"] for r in runs} == set(contenders)
    for contender in contenders:
        mine = [r for r in runs if r["contender"] == contender]
        assert any(r["label"] == "fresh" for r in mine), contender
        warm_points = {r["point"] for r in mine if r["label"] == "warm"}
        if contender in READERS:  # once per topic
            assert warm_points, contender
        else:
            assert warm_points == points, contender
        for run in mine:
            assert run["records"] == run["messages"] > 0
            assert run["records_per_s"] > 0 and run["batches"] >= 1
            assert run["peak_rss_mb"] > 0 and run["cpu_s"] >= 0
            if contender == READER_SLOTS:  # at most one process per partition
                assert run["processes"] == min(SPARK_TASK_SLOTS, run["partitions"]), run
    assert {p["contender"] for p in result["latency"]} == set(FOLLOWERS) & set(contenders)
    for probe in result["latency"]:
        assert probe["producer_batches"] > 0
        assert 0 < probe["p50_ms"] <= probe["p99_ms"] <= probe["max_ms"]
    # the scale phase: both partition counts timed, first and warm, every batch's parts reported
    scale = result["scale"]
    assert scale["partitions"] == [8, 128]
    assert {(r["partitions"], r["label"]) for r in scale["runs"]} == {
        (8, "first"),
        (128, "first"),
        (8, "warm"),
        (128, "warm"),
    }
    for run in scale["runs"]:
        assert run["records"] == run["messages"] > 0
        assert run["batches"], run
        for batch in run["batches"]:
            assert batch["interval_s"] >= batch["job_s"] > 0 and batch["outside_s"] >= 0
            assert batch["ranges"] >= 1 and batch["records"] >= 0
    assert scale["ratio_label"] == "warm" and scale["ratio"] > 0
    # the scale topics are spread over every partition: a batch of 500 at 128 partitions has 128 ranges
    assert max(b["ranges"] for r in scale["runs"] if r["partitions"] == 128 for b in r["batches"]) == 128
    assert [(u["partitions"], u["label"], u["round"]) for u in scale["user"]] == [
        (8, "first", 0),
        (128, "first", 0),
    ]
    assert all(u["records"] == 1_500 and u["ranges_p50"] >= u["partitions"] / 2 for u in scale["user"])
    # thousands of partitions and many jobs, at the smoke's sizes (benchmarks/scale.py)
    more = scale["more"]
    assert more["plan"]["partitions"] == 128 and more["plan"]["p50_ms"] > 0
    hot = {c["batches"]: c for c in more["hot"]["checkpoints"]}
    assert hot[50]["updates"] == 50 * 8  # every claim an UPDATE of its row
    assert more["hot"]["total_ratio"] > 0
    jobs = more["jobs"]
    assert [(r["mode"], r["jobs"]) for r in jobs["runs"]] == [("many", 2), ("one", 1)]
    for run in jobs["runs"]:
        assert run["exact"] and not run["errors"] and run["records"] > 0, run
        assert run["samples"] >= 1 and run["peak_connections"] >= 1
    # every lock wait sampled is kept with its blockers (the figure itself is the bench's to report)
    assert all(len(r["waits"]) == min(r["lock_waits"], 50) for r in jobs["runs"])
    assert all(w["blockers"] is not None for r in jobs["runs"] for w in r["waits"])
    # the memory phase: one job of max_batches batches, the workers found and sampled
    memory = result["memory"]
    if with_memory:
        assert memory["batches"] == memory_batches
        assert [s["batch"] for s in memory["samples"]][:2] == [1, 5]
        assert memory["samples"][-1]["batch"] == memory_batches
        assert all(s["workers"] >= 1 and s["workers_mb"] > 0 and s["jvm_mb"] > 0 for s in memory["samples"])
        assert memory["sampled_from"] == 5 and memory["sampled_to"] == memory_batches
        assert math.isfinite(memory["workers_rss_growth_mb"])
    else:
        assert not memory, memory
    assert not result["lineage"]  # the lineage phase is not in the smoke (test_bench_lineage.py, slow)
    assert set(result["findings"]) == {
        "per_batch_128_vs_8",
        "workers_rss_growth_mb",
        "workers_rss_growth_pct",
        "reader_vs_raw_1proc_per_slot",
    }
    assert set(result["headline"]) == {
        "eo_vs_sss_small",
        "eo_vs_sss_large",
        "eo_vs_alo",
        "reader_vs_raw",
        "writes_vs_copy",
    }
