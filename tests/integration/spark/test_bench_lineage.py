"""``make bench``'s lineage phase alone (BENCH_PHASES=lineage) at the smoke size, as a subprocess:
eo_partition with and without the commits rows, alternating in one session, each run checked
against the oracle and by its commits rows inside the benchmark; here: the runs, the figure's line
and the JSON. Slow (a Spark worker of its own, about 2 minutes): the smoke in make test leaves the
phase out. No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from tests.fix_services import Services, run_module

COST = re.compile(
    r"^bench: lineage_cost_pct=(?P<pct>\S+) lineage_pair_iqr_pct=\S+ lineage_claim_cost_pct=(?P<claim>\S+)$",
    re.MULTILINE,
)


@pytest.mark.slow
def test_bench_lineage_phase(services: Services, tmp_path: Path) -> None:
    out = tmp_path / "lineage.json"
    env = services.environ({k: v for k, v in os.environ.items() if not k.startswith("BENCH_")})
    env |= {"BENCH_SIZE": "smoke", "BENCH_PHASES": "lineage", "BENCH_LINEAGE_RUNS": "2"}
    done = run_module("benchmarks.bench", "--out", str(out), "--no-docs", env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = COST.findall(done.stdout)
    assert len(figures) == 2, done.stdout[-3000:]  # after the phase, and again before the findings
    assert figures[0] == figures[1] and math.isfinite(float(figures[0][0]))
    assert math.isfinite(float(figures[0][1])) and float(figures[0][1]) >= 0  # the claims, measured
    lin = json.loads(out.read_text())["lineage"]
    assert lin["point"] == "p8-c100" and lin["warm_runs"] == 2
    assert [(r["lineage"], r["label"]) for r in lin["runs"]] == [
        (True, "first"),
        (False, "first"),
        (False, "warm"),
        (True, "warm"),
        (True, "warm"),
        (False, "warm"),
    ]
    for run in lin["runs"]:
        assert run["records"] == lin["messages"] > 0 and run["records_per_s"] > 0
        # the switch worked: at least a row per batch with the lineage, none without
        assert run["commit_rows"] >= run["batches"] if run["lineage"] else run["commit_rows"] == 0
    assert lin["cost_pct"] == pytest.approx((1 - lin["on_rps"] / lin["off_rps"]) * 100)
    assert f"{lin['cost_pct']:.2f}" == figures[0][0]
    claims = lin["claims"]
    assert claims["ranges_per_transaction"] == 4 and len(claims["on_blocks"]) == len(claims["off_blocks"]) > 0
    assert claims["on_ms_per_range"] > 0 and claims["off_ms_per_range"] > 0
