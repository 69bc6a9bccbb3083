"""The scale phase at thousands of partitions and with many jobs (after its per-batch runs, which
bench.py times on every partition count in one alternating session):

* planning time at the largest partition count (p50 of a fresh job's plans after its first);
* the offsets table after many batches of claims: HOT-update ratio, size vs after a few batches;
* N jobs on threads of one Spark application (run_jobs) vs ONE job over their N topics (the same
  records and total parallelism), each exact, with PostgreSQL sampled for lock waits between them
  and for the bench's peak connections against the connection budget; at two sizes: batches of a few
  thousand records per job, and small ones where the per-batch costs are all there is.

:func:`line` is the last-lines row ``bench: per_batch_1024_vs_8=.. per_batch_4096_vs_8=..
plan_4096_p50_ms=.. hot_ratio=.. jobs32_vs_1=.. jobs32_exact=yes|no peak_connections=n/budget``
(the counts are the run's: the smoke's row names its own smaller ones), with
``user_per_batch_4096_vs_8=.. user_per_batch_4096_vs_8_spread=lo-hi`` after the bench's own: the
README-shaped job (benchmarks/user_scale.py), the median of its rounds' ratios and their range.
"""

from __future__ import annotations

import uuid
from statistics import median
from typing import Any

from benchmarks import scale_jobs, store_scale
from benchmarks.dataset import Dataset, delete_topics, produce_dataset
from benchmarks.settings import EO_PARTITION, SPARK_TASK_SLOTS, WARM, ScaleMore, Size
from benchmarks.stats import ratio
from benchmarks.worker import Spec, Worker
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.planner import Limits
from txn_offsets.store.database import engine_for


def say(text: str) -> None:
    print(f"bench: {text}", flush=True)


def worker_spec(db: DatabaseSettings, kafka: KafkaSettings, jars: tuple[str, ...]) -> tuple[Spec, str]:
    """The scale phase's worker: eo_partition on a FAIR session (one job in the default pool runs
    as under FIFO), its connections tagged with a fresh application_name (the sampler's filter)."""
    app = f"bench-{uuid.uuid4().hex[:8]}"
    conf = (("spark.scheduler.mode", "FAIR"),)
    return Spec(EO_PARTITION, scale_jobs.tagged(db, app), kafka, jars, conf=conf), app


def measure(
    size: Size,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    worker: Worker,
    *,
    app: str,
    topics: dict[int, Dataset],
) -> dict[str, Any]:
    """Plans, claims and jobs, after the per-batch runs (`topics`: theirs) in the same `worker`."""
    more = size.scale_more
    out: dict[str, Any] = {"settings": dict(vars(more))}
    if more.many:
        n = max(more.many)
        engine = engine_for(db)
        try:
            out["plan"] = store_scale.time_planning(
                engine,
                db,
                kafka,
                (topics[n].topic,),
                runs=more.plans,
                limits=Limits(max_records_per_batch=size.scale_batch_records),
            )
        finally:
            engine.dispose()
        p = out["plan"]
        say(f"scale plan p{n}: first {p['first_ms']:.0f} ms, then p50 {p['p50_ms']:.0f} ms")
    out["hot"] = store_scale.measure_offsets_table(
        db, partitions=more.hot_partitions, checkpoints=more.hot_batches
    )
    for at in out["hot"]["checkpoints"]:
        say(
            f"scale claims {at['batches']:>6} batches x {more.hot_partitions} partitions: HOT "
            f"{at['hot_updates']:,}/{at['updates']:,} = {_x(at['hot_ratio'], '.3f')}, offsets table "
            f"{at['total_bytes'] / 1024:,.0f} kB ({at['seconds']:.0f}s)"
        )
    out["jobs"] = jobs(size, kafka, worker, app)
    return out


def jobs(size: Size, kafka: KafkaSettings, worker: Worker, app: str) -> dict[str, Any]:
    """N jobs vs one at job_records per topic; then (job_small_records) the same with small batches,
    where the per-batch costs are all there is (kept under "small")."""
    more = size.scale_more
    out = _jobs_at(more, more.job_records, kafka, worker, app)
    if more.job_small_records:
        out["small"] = _jobs_at(more, more.job_small_records, kafka, worker, app)
    return out


def _jobs_at(more: ScaleMore, records: int, kafka: KafkaSettings, worker: Worker, app: str) -> dict[str, Any]:
    data = [produce_dataset(kafka, more.job_partitions, records) for _ in range(more.jobs)]
    say(f"scale jobs: {more.jobs} topics of {records:,} records, {more.job_partitions} partitions")
    per_job = max(1, min(d.messages for d in data) // more.job_batches)
    runs = []
    try:
        for round_ in range(more.job_rounds):
            for mode in ("many", "one") if round_ % 2 == 0 else ("one", "many"):
                run = worker.call("jobs", datasets=data, batch_records=per_job, mode=mode, app=app)
                run["round"] = round_
                runs.append(run)
                say(
                    f"scale jobs {mode:4} ({run['jobs']:2d} job(s)) {run['seconds']:7.2f}s "
                    f"{run['records_per_s']:>9,.0f} rec/s exact={'yes' if run['exact'] else 'no'} "
                    f"lock waits {run['lock_waits']} in {run['samples']} samples, "
                    f"peak connections {run['peak_connections']}"
                )
    finally:
        delete_topics(kafka, [d.topic for d in data])
    best = {m: max(r["records_per_s"] for r in runs if r["mode"] == m) for m in ("many", "one")}
    return {
        "jobs": more.jobs,
        "records": records,
        "batch_records": per_job,
        "runs": runs,
        "many_vs_one": ratio(best["many"], best["one"]),
        "exact": all(r["exact"] for r in runs),
        "lock_waits": sum(r["lock_waits"] for r in runs if r["mode"] == "many"),
        "peak_connections": max(r["peak_connections"] for r in runs),
        "budget": scale_jobs.connection_budget(more.jobs, SPARK_TASK_SLOTS),
    }


def values(result: dict[str, Any]) -> dict[str, Any]:
    """The row's values (None: not measured)."""
    scale = result.get("scale") or {}
    more = scale.get("more")
    if not more:
        return {}
    label = scale.get("ratio_label", WARM)
    stats = scale.get(label) or {}
    few = str(scale["partitions"][0])
    out: dict[str, Any] = {}
    for n in more["settings"]["many"]:
        mine, base = stats.get(str(n)), stats.get(few)
        out[f"per_batch_{n}_vs_{few}"] = ratio(
            mine and mine["interval_p50_s"], base and base["interval_p50_s"]
        )
    user = scale.get("user") or []
    if user:  # the README-shaped job (bench.py user_scale): warm rounds, else the first runs
        name = f"user_per_batch_{max(r['partitions'] for r in user)}_vs_{few}"
        spread = user_spread(user)
        out[name] = user_ratio(user)
        out[f"{name}_spread"] = f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else None
    if "plan" in more:
        out[f"plan_{more['plan']['partitions']}_p50_ms"] = more["plan"]["p50_ms"]
    out["hot_ratio"] = more["hot"]["hot_ratio"]
    j = more["jobs"]
    both = [j, *([j["small"]] if "small" in j else [])]  # exact and within budget: both workloads
    out[f"jobs{j['jobs']}_vs_1"] = j["many_vs_one"]
    out[f"jobs{j['jobs']}_exact"] = "yes" if all(w["exact"] for w in both) else "no"
    out["peak_connections"] = f"{max(w['peak_connections'] for w in both)}/{j['budget']}"
    return out


def user_ratio(runs: list[dict[str, Any]]) -> float | None:
    """The user job's per-batch p50 at its most partitions over its fewest: the median over its warm
    rounds of each round's ratio (the round's two runs, next to each other), as the modes phase's
    ratios are taken; the first runs' ratio when no round is warm. Runs recorded without their round
    (results before 2026-11-30): the median of the warm runs' p50s at each count, one over the other."""
    ratios = _round_ratios(runs)
    if ratios is not None:
        return median(ratios) if ratios else None
    counts = sorted({r["partitions"] for r in runs})
    if len(counts) < 2:
        return None
    warm = [r for r in runs if r["label"] == WARM] or runs
    p50 = {
        n: median(
            [r["interval_p50_s"] for r in warm if r["partitions"] == n and r["interval_p50_s"]] or [0.0]
        )
        for n in counts
    }
    return ratio(p50[counts[-1]] or None, p50[counts[0]] or None)


def user_spread(runs: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The lowest and highest of the rounds' ratios behind :func:`user_ratio` (None: no round)."""
    ratios = _round_ratios(runs)
    return (min(ratios), max(ratios)) if ratios else None


def _round_ratios(runs: list[dict[str, Any]]) -> list[float] | None:
    """Each round's p50 at the most partitions over its p50 at the fewest: the warm rounds' (round
    >= 1), or the first runs' (round 0) when none is warm; None when runs carry no round."""
    if not runs or any("round" not in r for r in runs):
        return None
    counts = sorted({r["partitions"] for r in runs})
    if len(counts) < 2:
        return []
    by_round: dict[int, dict[int, float]] = {}
    for r in runs:
        if r["partitions"] in (counts[0], counts[-1]) and r["interval_p50_s"]:
            by_round.setdefault(r["round"], {})[r["partitions"]] = r["interval_p50_s"]
    paired = {k: v for k, v in by_round.items() if len(v) == 2}
    chosen = [k for k in paired if k >= 1] or [k for k in paired if k == 0]
    return [paired[k][counts[-1]] / paired[k][counts[0]] for k in sorted(chosen)]


def line(result: dict[str, Any]) -> str | None:
    shown = values(result)
    if not shown:
        return None

    def fmt(key: str, value: Any) -> str:
        if value is None:
            return "nan"
        if isinstance(value, str):
            return value
        return f"{value:.0f}" if key.endswith("_ms") else f"{value:.2f}"

    return "bench: " + " ".join(f"{k}={fmt(k, v)}" for k, v in shown.items())


def markdown(result: dict[str, Any]) -> list[str]:
    more = (result.get("scale") or {}).get("more")
    if not more:
        return []
    hot, j = more["hot"], more["jobs"]
    first, last = hot["checkpoints"][0], hot["checkpoints"][-1]
    lines = [
        "Thousands of partitions and many jobs (`scale` phase, same session as the table above):",
        "",
    ]
    if "plan" in more:
        p = more["plan"]
        lines.append(
            f"- Planning at {p['partitions']:,} partitions: p50 **{p['p50_ms']:.0f} ms** over {p['plans']} "
            f"plans of a running job (max {p['max_ms']:.0f} ms; its first plan, which seeds the rows: "
            f"{p['first_ms']:.0f} ms)."
        )
    lines += [
        f"- The offsets table under batches of claims ({hot['partitions']} partitions, each batch one "
        f"transaction): HOT-update ratio **{_x(last['hot_ratio'], '.3f')}** after "
        f"{last['batches']:,} batches ({_x(first['hot_ratio'], '.3f')} after "
        f"{first['batches']:,}); size {last['total_bytes'] / 1024:,.0f} kB vs "
        f"{first['total_bytes'] / 1024:,.0f} kB (**{_x(hot['total_ratio'])}x**), heap + indexes"
        + (
            f"; the oldest other open transaction during the batches: {hot['oldest_transaction_max_s']:g} s "
            f"(one holds every dead row version; waited {hot.get('waited_s', 0):g} s for none older than 1 s "
            f"before starting)."
            if "oldest_transaction_max_s" in hot
            else "."
        )
        + _attempts(hot.get("attempts", [])),
    ]
    user = (result.get("scale") or {}).get("user") or []
    if user:
        runs = ", ".join(
            f"{r['partitions']:,} {r['label']} {_x(r['interval_p50_s'], '.3f')} s "
            f"({r['ranges_p50'] or 0:,.0f} ranges)"
            for r in user
        )
        spread = user_spread(user)
        lines.append(
            "- The job as the README writes one (`benchmarks/user_scale.py`: per-range `write` of an "
            "`upsert_add`, decode -> 1, aggregate = sum) on topics spread over every partition, per-batch "
            f"p50 (ranges per batch) in run order: {runs}; warm over warm **{_x(user_ratio(user))}x**"
            + (f" (the rounds' ratios {spread[0]:.2f}-{spread[1]:.2f})." if spread else ".")
        )
    for w in (j, *([j["small"]] if "small" in j else [])):
        lines += [
            f"- {w['jobs']} jobs on threads of one Spark application (`run_jobs`: shared rounds, one "
            f"driver engine), a topic of {w.get('records', 0):,} records each in batches of "
            f"{w['batch_records']:,}, vs one job over all {w['jobs']} topics (batches of "
            f"{w['batch_records'] * w['jobs']:,}): **{_x(w['many_vs_one'])}x** the records/s (best of "
            f"each), exact: {'yes' if w['exact'] else '**no**'}; lock waits of one job's backend on "
            f"another's (pg_locks, every {scale_jobs.SAMPLE_EVERY_S:g} s): {w['lock_waits']}; peak "
            f"connections {w['peak_connections']} (budget {w['budget']}).",
            "",
            "| jobs | round | seconds | records/s | exact | lock waits | samples | peak connections |",
            "|---|---:|---:|---:|---|---:|---:|---:|",
            *(
                f"| {r['jobs']} | {r['round']} | {r['seconds']:.2f} | {r['records_per_s']:,.0f} | "
                f"{'yes' if r['exact'] else 'no'} | {r['lock_waits']} | {r['samples']} | "
                f"{r['peak_connections']} |"
                for r in w["runs"]
            ),
            "",
        ]
    return lines


def _x(value: float | None, fmt: str = ".2f") -> str:
    return "nan" if value is None else format(value, fmt)


def _attempts(attempts: list[dict[str, Any]]) -> str:
    """What the measurements before the kept one saw (another transaction of the database open
    while the claims ran: they were measured again)."""
    if len(attempts) < 2:
        return ""
    seen = "; ".join(
        f"attempt {i}: {'another transaction seen' if a['disturbed'] else 'undisturbed'}, HOT "
        f"{_x(a['hot_ratio'], '.3f')}, size {_x(a['total_ratio'])}x"
        for i, a in enumerate(attempts, 1)
    )
    return (
        f" Measured {len(attempts)} times (again whenever another transaction of the database, seen "
        f"as the stack's superuser, was open during the claims: it holds the dead row versions): {seen}."
    )
