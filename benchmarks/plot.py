"""The PNG of a bench result (matplotlib, Agg backend: no display needed).

Left: warm records/s per sweep point and contender (log scale), the reader limits of the point's
topic as ticks (1 process: black, one process per task slot: dashed grey). Right: caught-up
latency p50 and p99 per follower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report import reader_rps, rps
from benchmarks.settings import (
    ALO,
    EO_BATCH,
    EO_FRAME,
    EO_PARTITION,
    EO_STREAM,
    LABELS,
    READER,
    READER_SLOTS,
    SSS,
)

BARS = (EO_PARTITION, EO_FRAME, EO_BATCH, EO_STREAM, ALO, SSS)
COLOURS = {
    EO_PARTITION: "#1f77b4",
    EO_FRAME: "#08519c",
    EO_BATCH: "#6baed6",
    EO_STREAM: "#9467bd",
    ALO: "#ff7f0e",
    SSS: "#2ca02c",
}


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    points = sorted(result["meta"]["points"], key=lambda p: (p["partitions"], p["cap"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(BARS)
    for i, contender in enumerate(BARS):
        xs, ys = [], []
        for j, point in enumerate(points):
            value = rps(runs, contender, point["name"])
            if value:
                xs.append(j + (i - (len(BARS) - 1) / 2) * width)
                ys.append(value)
        left.bar(xs, ys, width, label=LABELS[contender], color=COLOURS[contender])
    for limit, colour, style in ((READER, "black", "solid"), (READER_SLOTS, "dimgrey", "dashed")):
        limit_label = LABELS[limit]
        for j, point in enumerate(points):
            value = reader_rps(runs, point, limit)
            if value:
                left.hlines(
                    value, j - 0.45, j + 0.45, colors=colour, linestyles=style, linewidth=2, label=limit_label
                )
                limit_label = "_nolegend_"
    left.set_xticks(range(len(points)), [f"{p['partitions']} part.\ncap {p['cap']:,}" for p in points])
    left.set_xlabel("topic partitions, cap = records per partition per batch")
    if any(rps(runs, c, p["name"]) for c in BARS for p in points):  # not with the sweep left out
        left.set_yscale("log")
    left.set_ylabel("records/s (warm, log scale)")
    left.set_title("Throughput per sweep point")
    left.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.24))
    left.grid(axis="y", which="both", alpha=0.3)

    probes = result["latency"]
    names = [LABELS[p["contender"]].replace(" ", "\n", 1) for p in probes]
    xs = list(range(len(probes)))
    right.bar([x - 0.2 for x in xs], [p["p50_ms"] for p in probes], 0.4, label="p50", color="#9ecae1")
    right.bar([x + 0.2 for x in xs], [p["p99_ms"] for p in probes], 0.4, label="p99", color="#3182bd")
    right.set_xticks(xs, names, fontsize=8)
    right.set_ylabel("ms")
    rate = f"{probes[0]['rate']:,} rec/s" if probes else ""
    right.set_title(f"Caught-up latency ({rate})")
    right.legend(fontsize=8)
    right.grid(axis="y", alpha=0.3)

    meta = result["meta"]
    fig.suptitle(
        f"make bench, BENCH_SIZE={meta['size']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['memory_gib']} GiB - {meta['finished_at']}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
