"""txn_offsets' low-latency mode (``run_job(..., low_latency=LowLatency(...))``) in the latency phase.

Two uses, both the same PartitionWriter job as ``eo_partition`` (examples/windowed_counts.py):

* :func:`follow` - the latency follower: the twin of :func:`benchmarks.contenders.follow_eo` with
  :data:`FOLLOW` (ranges committed every :data:`COMMIT_INTERVAL_MS` ms) instead of batches;
* :func:`run` - a throughput run over a whole pre-produced topic until caught up, at the large
  batch cap (``commit_max_records`` = the cap per partition), checked against the oracle like any
  sweep run (:meth:`benchmarks.worker.Service.run`). :func:`order` alternates it with batch
  mode's ``eo_partition`` in one session and :func:`throughput_ratio` is the bench's
  ``low_latency_throughput_vs_batch``.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

from benchmarks import contenders, sink
from benchmarks.contenders import Context, Outcome, _job
from benchmarks.settings import EO_LOW_LATENCY, EO_PARTITION
from examples import windowed_counts
from txn_offsets import LowLatency, StartPolicy, run_job

COMMIT_INTERVAL_MS = 5.0
EPOCH_S = 60.0  # the mode's default: a 60 s probe crosses about one epoch boundary
# the follower: small ranges every few ms (polls of at most min(2,000, commit_max_records) records)
FOLLOW = LowLatency(epoch_s=EPOCH_S, commit_interval_ms=COMMIT_INTERVAL_MS)
FIRST = "first"  # the untimed first run of each side in a session (Python workers, consumers start)


def options(cap: int) -> LowLatency:
    """The throughput run's settings: the follower's, a range of at most `cap` records per partition
    (batch mode's large cap per partition on average)."""
    return LowLatency(epoch_s=EPOCH_S, commit_interval_ms=COMMIT_INTERVAL_MS, commit_max_records=cap)


def follow(spark: Any, ctx: Context, stop: threading.Event) -> threading.Thread:
    """run_job in low-latency mode following the topic (the latency probe) until `stop` is set."""
    return contenders.follow_thread(spark, ctx, stop, "lowlat-follow", low_latency=FOLLOW)


def run(spark: Any, ctx: Context) -> Outcome:
    """The whole topic in low-latency mode until caught up (an Outcome commit per epoch)."""
    out = Outcome()
    summary = run_job(
        spark,
        job=_job("lowlat"),
        kafka=ctx.kafka,
        database=ctx.db,
        writer=windowed_counts.WRITER,
        topics=[ctx.topic],
        start=StartPolicy.earliest(),
        until_caught_up=True,
        on_batch=lambda report: out.committed(report.records),
        low_latency=options(ctx.cap),
    )
    if summary.records != out.records:
        raise sink.WrongResult(
            f"eo_low_latency: the summary says {summary.records}, the epochs {out.records}"
        )
    return out


def order(runs: int) -> list[tuple[str, str]]:
    """(contender, first|warm) of the throughput comparison in one session: an untimed first run of
    each (it pays the Python workers' and consumers' start), then `runs` rounds alternating which
    goes first (ABBA...), so that a drift of the machine weighs on both alike."""
    a, b = EO_PARTITION, EO_LOW_LATENCY
    out = [(a, FIRST), (b, FIRST)]
    for round_ in range(runs):
        pair = (b, a) if round_ % 2 == 0 else (a, b)
        out += [(c, "warm") for c in pair]
    return out


def throughput_ratio(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The low-latency mode's records/s over batch mode's from the warm runs of :func:`order`: the
    best run of each (the run least disturbed by the rest of a shared machine, as the sweep's
    ratios), and the median of each round's ratio beside it. None without warm runs of both."""
    rates: dict[str, list[float]] = {EO_PARTITION: [], EO_LOW_LATENCY: []}
    for r in runs:
        if r.get("label") != FIRST and r.get("records_per_s") and r.get("contender") in rates:
            rates[r["contender"]].append(float(r["records_per_s"]))
    batch, low = rates[EO_PARTITION], rates[EO_LOW_LATENCY]
    if not batch or not low:
        return {"ratio": None, "median_round_ratio": None, "runs": len(batch) + len(low)}
    rounds = [lo / ba for ba, lo in zip(batch, low, strict=False)]
    return {
        "ratio": max(low) / max(batch),
        "median_round_ratio": statistics.median(rounds),
        "batch_best_records_per_s": max(batch),
        "low_latency_best_records_per_s": max(low),
        "runs": len(batch) + len(low),
    }
