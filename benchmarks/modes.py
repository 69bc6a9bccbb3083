"""The modes phase: each way to use txn_offsets against its reference, in alternating warm rounds.

Users pick a mode for reasons of their own (Spark Connect only, a shuffle, Structured Streaming's
API), so each mode is held against what it replaces, on the headline topics (8 partitions) at both
batch caps, in ONE worker: one SparkSession (one JVM, the same Python workers) that also runs a
Spark Connect server, to which the same process holds a Connect client
(``local_session(serve_connect=True)`` + ``connect_client``: the Spark Connect service of
``SparkSession.builder.remote("local[2]")``, on a free loopback port):

* ``connect_vs_rdd``            PartitionWriter through the Connect session (DataFrame path) over the RDD path
* ``frame_vs_rdd``              the same DataFrame path forced on the classic session over the RDD path
* ``batchwriter_vs_partition``  BatchWriter over PartitionWriter, its compute a shuffle (``reduceByKey``)
* ``batchwriter_merged_vs_partition``  the same BatchWriter with a one-stage compute (each Spark
  partition's partials collected and merged on the driver: the same work as PartitionWriter's
  batch) over PartitionWriter - the mode's own cost; the two BatchWriter fields differ by what
  Spark's shuffle costs a batch
* ``stream_vs_sss``             the Structured Streaming adapter over SSS with its own Kafka source
* ``eo_vs_alo``                 PartitionWriter over the same job without the guard

``warmup`` rounds of every contender first (not counted: Python workers, the JVMs' JIT, plans and
caches; one was not enough: the eighth pass's runs still got faster over their first 2-3 rounds,
e.g. eo_partition 6.2, 4.0, 3.6, 2.9, 3.5 s at the small cap, where alo was warm from its second
run), then ``rounds`` rounds of one run each, every round in another order (rotated, and reversed
every other round). Each field is
the median over the rounds of the round's ratio of records/s, shown with the rounds' spread (lowest
and highest round); every run checked against the oracle like a sweep run (``Service.run``).
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.settings import (
    ALO,
    EO_BATCH,
    EO_BATCH_MERGED,
    EO_CONNECT,
    EO_FRAME,
    EO_PARTITION,
    EO_STREAM,
    SSS,
    Point,
)

__all__ = ["CONTENDERS", "PAIRS", "fields", "line", "markdown", "order", "phase", "summary"]

#: every contender of the phase, in the first round's order
CONTENDERS = (EO_PARTITION, EO_CONNECT, EO_FRAME, EO_BATCH, EO_BATCH_MERGED, ALO, EO_STREAM, SSS)
#: field -> (the mode, its reference): the field is the mode's records/s over the reference's
PAIRS: dict[str, tuple[str, str]] = {
    "connect_vs_rdd": (EO_CONNECT, EO_PARTITION),
    "frame_vs_rdd": (EO_FRAME, EO_PARTITION),
    "batchwriter_vs_partition": (EO_BATCH, EO_PARTITION),
    "batchwriter_merged_vs_partition": (EO_BATCH_MERGED, EO_PARTITION),
    "stream_vs_sss": (EO_STREAM, SSS),
    "eo_vs_alo": (EO_PARTITION, ALO),
}
CAPS = ("small", "large")
FIRST, WARM = "first", "warm"
RETRIES = 3  # runs again of a run whose Python process did not connect back to Spark in time


def order(contenders: tuple[str, ...], rounds: int, warmup: int = 1) -> list[tuple[int, str]]:
    """(round, contender) in the order to run them: round 0 in the given order, then round k
    (1..warmup + rounds - 1) rotated by k and reversed every other round, so no contender is always
    first, or always next to the same one. Rounds below `warmup` warm up (:func:`phase` labels them
    FIRST: not counted)."""
    runs = [(0, c) for c in contenders]
    for k in range(1, warmup + rounds):
        shift = k % len(contenders)
        turned = [*contenders[shift:], *contenders[:shift]]
        runs += [(k, c) for c in (turned[::-1] if (k - warmup) % 2 == 0 else turned)]
    return runs


def phase(bench: Any) -> dict[str, Any]:
    """Both headline caps, in one worker (bench.Bench's topics and spec); the runs and the fields."""
    from benchmarks.bench import say
    from benchmarks.worker import Worker

    size = bench.size
    points = {cap: size.headline(c) for cap, c in zip(CAPS, (size.small_cap, size.large_cap), strict=True)}
    worker = Worker(bench.spec(EO_PARTITION, connect=True))
    runs: list[dict[str, Any]] = []
    try:
        for cap, point in points.items():
            data = bench.topic(point.partitions, point.messages)
            for round_, contender in order(CONTENDERS, size.modes_rounds, size.modes_warmup):
                label = FIRST if round_ < size.modes_warmup else WARM
                numbers = _run(worker, point, data, label, contender)
                run = {"contender": contender, "cap": cap, "point": point.name, "round": round_}
                runs.append(run | {"label": label, **numbers})
                say(
                    f"modes {point.name:10} {contender:12} round {round_} {numbers['seconds']:7.2f}s "
                    f"{numbers['records_per_s']:>10,.0f} rec/s  batches {numbers['batches']:3d} "
                    f"p50 {numbers['batch_p50_s']:.3f}s  cpu {numbers['cpu_s_per_1k']:.3f} s/1k"
                )
    finally:
        worker.close()
    return {"points": {cap: _point(p) for cap, p in points.items()}, "runs": runs, **summary(runs)}


def _run(worker: Any, point: Point, data: Any, label: str, contender: str) -> dict[str, Any]:
    """One run; again (at most RETRIES times) when a Python process Spark started did not connect
    back within Spark's fixed timeout (a process start on an overloaded machine: seen at load
    average 12-21 on 2 cores, before the run read anything)."""
    from benchmarks.bench import say
    from benchmarks.worker import WorkerFailed

    for attempt in range(RETRIES + 1):
        worker.call("warm")  # every pool of Python workers alive before the clock (Service.keep_warm)
        try:
            answer: dict[str, Any] = worker.call(
                "run", point=point, data=data, label=label, contender=contender
            )
        except WorkerFailed as exc:
            if "failed to connect back" not in str(exc) or attempt == RETRIES:
                raise
            say(f"modes {point.name} {contender}: a Python worker did not connect back in time; run again")
        else:
            return answer
    raise AssertionError("unreachable")


def _point(point: Point) -> dict[str, Any]:
    return {"name": point.name, "partitions": point.partitions, "cap": point.cap, "messages": point.messages}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per field and cap: the median of the warm rounds' ratios of records/s, their lowest and
    highest, the rounds; and the same of CPU (the reference's CPU s / 1k records over the mode's:
    above 1, the mode costs less CPU - on a shared machine much steadier than wall time)."""
    out: dict[str, Any] = {"ratios": {}, "cpu_ratios": {}}
    for name, (mode, reference) in PAIRS.items():
        for cap in CAPS:
            for key, section in (("records_per_s", "ratios"), ("cpu_s_per_1k", "cpu_ratios")):
                if key == "records_per_s":
                    ratios = _round_ratios(runs, cap, mode, reference, key)
                else:
                    ratios = _round_ratios(runs, cap, reference, mode, key)
                out[section][f"{name}_{cap}"] = {
                    "median": statistics.median(ratios) if ratios else None,
                    "low": min(ratios, default=None),
                    "high": max(ratios, default=None),
                    "rounds": ratios,
                }
    return out


def _round_ratios(runs: list[dict[str, Any]], cap: str, a: str, b: str, key: str) -> list[float]:
    """Each warm round's `key` of contender `a` over `b`'s."""

    def rps(contender: str, round_: int) -> float | None:
        found = [r for r in runs if (r["cap"], r["contender"], r["round"]) == (cap, contender, round_)]
        return found[0][key] if found else None

    rounds = sorted({r["round"] for r in runs if r["cap"] == cap and r["label"] == WARM})
    pairs = ((rps(a, k), rps(b, k)) for k in rounds)
    return [a / b for a, b in pairs if a is not None and b]


def _ratios(modes: dict[str, Any] | None, section: str = "ratios") -> dict[str, Any]:
    """The phase's ratios, derived again from its runs (a saved result renders with this code)."""
    runs = (modes or {}).get("runs")
    return summary(runs)[section] if runs else {}


def fields(modes: dict[str, Any] | None) -> dict[str, float | None]:
    """The last line's fields of the phase (None where it did not run)."""
    ratios = _ratios(modes)
    return {f"{name}_{cap}": ratios.get(f"{name}_{cap}", {}).get("median") for name in PAIRS for cap in CAPS}


def spreads(modes: dict[str, Any] | None) -> dict[str, tuple[float, float] | None]:
    ratios = _ratios(modes)
    out: dict[str, tuple[float, float] | None] = {}
    for key in fields(modes):
        found = ratios.get(key, {})
        out[key] = (found["low"], found["high"]) if found.get("low") is not None else None
    return out


def line(modes: dict[str, Any] | None) -> str:
    """``connect_vs_rdd_small=<r> ... eo_vs_alo_large=<r> eo_vs_alo_small_spread=<lo>-<hi> ...``:
    the medians, then eo_vs_alo's spreads (``nan`` where the phase did not run)."""
    shown = [f"{k}={_r(v)}" for k, v in fields(modes).items()]
    spread = spreads(modes)
    for cap in CAPS:
        found = spread[f"eo_vs_alo_{cap}"]
        shown.append(
            f"eo_vs_alo_{cap}_spread=" + ("nan" if found is None else f"{found[0]:.2f}-{found[1]:.2f}")
        )
    return " ".join(shown)


LABELS = {
    EO_PARTITION: "PartitionWriter (RDD path)",
    EO_CONNECT: "PartitionWriter through Spark Connect",
    EO_FRAME: "PartitionWriter, DataFrame path (classic session)",
    EO_BATCH: "BatchWriter (compute: a shuffle, reduceByKey)",
    EO_BATCH_MERGED: "BatchWriter (compute: one stage, merged on the driver)",
    ALO: "at-least-once (no guard)",
    EO_STREAM: "Structured Streaming adapter (open_stream)",
    SSS: "Structured Streaming + Spark's Kafka source",
}


def markdown(result: dict[str, Any]) -> list[str]:
    """The phase's section of docs/benchmarks.md (nothing when it did not run)."""
    modes = result.get("modes") or {}
    if not modes.get("runs"):
        return []
    runs = modes["runs"]
    warm = [r for r in runs if r["label"] == WARM]
    rounds = len({r["round"] for r in warm})
    warmup = len({r["round"] for r in runs if r["label"] == FIRST})
    points = modes["points"]
    out = [
        f"Modes (`BENCH_PHASES=modes`; one worker, {rounds} alternating warm rounds after {warmup} "
        f"warm-up round(s) of each, {points['small']['name']} / {points['large']['name']}: median warm "
        "records/s, and CPU s / 1k records):",
        "",
        "| contender | small cap rec/s | large cap rec/s | small CPU s/1k | large CPU s/1k |",
        "|---|---:|---:|---:|---:|",
    ]
    for contender in CONTENDERS:
        cells = []
        for key in ("records_per_s", "cpu_s_per_1k"):
            for cap in CAPS:
                values = [r[key] for r in warm if r["contender"] == contender and r["cap"] == cap and r[key]]
                fmt = ",.0f" if key == "records_per_s" else ".3f"
                cells.append(format(statistics.median(values), fmt) if values else "-")
        out.append(f"| {LABELS[contender]} | " + " | ".join(cells) + " |")
    out += [
        "",
        "| field | small cap: records/s (median, rounds' range) | large cap | small: CPU | large: CPU |",
        "|---|---:|---:|---:|---:|",
    ]
    walls, cpus = _ratios(modes), _ratios(modes, "cpu_ratios")
    for name in PAIRS:
        cells = []
        for ratios in (walls, cpus):
            for cap in CAPS:
                found = ratios.get(f"{name}_{cap}", {})
                cells.append(
                    "-"
                    if found.get("median") is None
                    else f"**{found['median']:.2f}** ({found['low']:.2f}-{found['high']:.2f})"
                )
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += [
        "",
        "CPU: the reference's CPU s / 1k records over the mode's (the worker's process tree: driver, JVM, "
        "Python workers), so above 1 the mode costs less.",
    ]
    return [*out, ""]


def _r(value: float | None) -> str:
    return "nan" if value is None else f"{value:.2f}"
