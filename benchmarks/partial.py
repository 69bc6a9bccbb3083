"""A run of some phases only (``BENCH_PHASES=lineage make bench``) updates its own sections of the
saved full run (benchmarks/results/full.json and docs/benchmarks.md), not the whole of it: the
other phases' figures stay those of the run that measured them, and ``meta.partial_runs`` says
which phases were measured later, and when."""

from __future__ import annotations

import copy
from typing import Any

from benchmarks.settings import LATENCY, LINEAGE, MEMORY, MODES, PHASES, SCALE, SWEEP

__all__ = ["OWNED", "OWNED_META", "is_partial", "merge"]

#: The result's sections each phase measures (the rest of a result is meta or derived).
OWNED: dict[str, tuple[str, ...]] = {
    SWEEP: ("runs", "latency"),
    SCALE: ("scale",),
    MEMORY: ("memory",),
    LATENCY: ("latency_phase", "low_latency_throughput", "low_latency_throughput_vs_batch"),
    LINEAGE: ("lineage",),
    MODES: ("modes",),
}


#: The meta each phase's own sections are read with (the sweep's points name the topics its runs
#: read: the reader limits are matched to a point by topic).
OWNED_META: dict[str, tuple[str, ...]] = {SWEEP: ("points", "headline_points", "messages")}


def is_partial(phases: tuple[str, ...]) -> bool:
    return set(phases) != set(PHASES)


def merge(saved: dict[str, Any], new: dict[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
    """`saved` with the sections of `phases` taken from `new` (headline and findings are derived
    again by the caller)."""
    out = copy.deepcopy(saved)
    for phase in phases:
        for key in OWNED[phase]:
            out[key] = copy.deepcopy(new.get(key))
        for key in OWNED_META.get(phase, ()):
            if key in new["meta"]:
                out["meta"][key] = copy.deepcopy(new["meta"][key])
    later = out["meta"].setdefault("partial_runs", [])
    later.append({"phases": list(phases), "finished_at": new["meta"]["finished_at"]})
    return out
