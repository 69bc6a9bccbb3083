"""The ``lineage`` phase of ``make bench``: what the lineage (one ``commits`` row per committed
range, inserted in the range's transaction) costs in records/s.

eo_partition at the small batch cap of the headline partition count (the sweep's point
``p8-c1000`` in full: the most transactions per record, where one more INSERT weighs most), on
the same topic and in one SparkSession (one worker process), with
``DatabaseSettings(lineage=True)`` and ``lineage=False``: a first run of each (not counted), then
``lineage_runs`` rounds alternating the order (off-on, on-off, ...), so a drift of a shared machine
weighs on both alike. Every run is checked against the oracle, and its ``commits`` rows are
counted: none with the lineage off, at least one per batch with it on (else the switch did not
work and the figure would be meaningless). The figure is ``lineage_cost_pct``: how much lower the
median warm records/s is with the lineage than without, in % (target: <= 3 %).

:func:`timed_run` runs in the worker (``worker.call("lineage", ...)``), :func:`phase` in the
orchestrator; :func:`summary`, :func:`line` and :func:`markdown` make the result's ``lineage``
section, its ``bench: lineage_cost_pct=..`` line and its part of docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from benchmarks import contenders, sink
from benchmarks.contenders import Context
from benchmarks.dataset import Dataset
from benchmarks.resources import Sampler
from benchmarks.settings import EO_PARTITION
from txn_offsets.store.schema import tables_for

if TYPE_CHECKING:
    from benchmarks.bench import Bench
    from benchmarks.worker import Service

TARGET_PCT = 3.0
FIRST, WARM = "first", "warm"


def _commit_rows(engine: sa.Engine, schema: str, topic: str) -> int:
    c = tables_for(schema).commits
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(c.c.topic == topic)).scalar_one())


def timed_run(service: Service, data: Dataset, cap: int, lineage: bool) -> dict[str, Any]:
    """(In the worker.) One eo_partition run over the whole topic with the lineage on or off, in
    the worker's session; checked against the oracle and by its commits rows."""
    db = dataclasses.replace(service.spec.db, lineage=lineage)
    ctx = Context(db, service.spec.kafka, data.topic, data.partitions, cap)
    sink.clear(service.engine, data.topic)
    rows_before = _commit_rows(service.engine, db.schema, data.topic)
    t0 = time.perf_counter()
    with Sampler() as usage:
        out = contenders.eo_partition(service.spark, ctx)
    seconds = time.perf_counter() - t0
    name = f"eo_partition lineage={'on' if lineage else 'off'}"
    sink.check(service.engine, data.topic, data.expected, name)
    if out.records != data.messages:
        raise sink.WrongResult(f"{name} counted {out.records} records, the topic has {data.messages}")
    rows = _commit_rows(service.engine, db.schema, data.topic) - rows_before
    if (rows > 0) != lineage or (lineage and rows < len(out.commits)):
        raise sink.WrongResult(f"{name}: {rows} commits rows for {len(out.commits)} batches")
    sink.clear(service.engine, data.topic)
    return {
        "seconds": seconds,
        "records": out.records,
        "records_per_s": out.records / seconds,
        "batches": len(out.commits),
        "commit_rows": rows,
        "cpu_s": usage.cpu_s,
    }


def order(rounds: int) -> list[tuple[bool, str]]:
    """(lineage on?, label): a first run of each, then `rounds` rounds alternating which goes first
    (off-on, on-off, ...): each setting gets `rounds` warm runs, as often first as second."""
    runs = [(True, FIRST), (False, FIRST)]
    for r in range(rounds):
        pair = [False, True] if r % 2 == 0 else [True, False]
        runs += [(on, WARM) for on in pair]
    return runs


def phase(bench: Bench) -> dict[str, Any]:
    """(In the orchestrator.) The alternating runs in one worker; the result's ``lineage`` section."""
    from benchmarks.worker import Worker

    size = bench.size
    point = size.headline(size.small_cap)
    data = bench.topic(point.partitions, point.messages)
    worker = Worker(bench.spec(EO_PARTITION))
    runs: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]  # the machine's 1-minute load average, before and after
    try:
        for i, (on, label) in enumerate(order(size.lineage_runs)):
            numbers = worker.call("lineage", data=data, cap=point.cap, lineage=on)
            runs.append({"lineage": on, "label": label, "order": i, **numbers})
            print(
                f"bench: lineage {'on ' if on else 'off'} {label:5} {numbers['seconds']:7.2f}s "
                f"{numbers['records_per_s']:>10,.0f} rec/s  batches {numbers['batches']:4d}  "
                f"commits rows {numbers['commit_rows']:6d}  cpu {numbers['cpu_s']:.1f}s",
                flush=True,
            )
    finally:
        worker.close()
    load.append(os.getloadavg()[0])
    result = summary(runs)
    result |= {
        "point": point.name,
        "partitions": point.partitions,
        "cap": point.cap,
        "messages": data.messages,
        "topic": data.topic,
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_avg": load,
        "cpus": os.cpu_count(),
    }
    print(line(result), flush=True)
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median warm records/s with and without the lineage, and the cost in %."""

    def warm(on: bool) -> list[float]:
        return [r["records_per_s"] for r in runs if r["lineage"] is on and r["label"] == WARM]

    on, off = warm(True), warm(False)
    on_rps = statistics.median(on) if on else None
    off_rps = statistics.median(off) if off else None
    cost = None if on_rps is None or not off_rps else (1 - on_rps / off_rps) * 100
    warm_runs = min(len(on), len(off))
    return {"runs": runs, "on_rps": on_rps, "off_rps": off_rps, "cost_pct": cost, "warm_runs": warm_runs}


def line(lineage: dict[str, Any]) -> str:
    cost = lineage.get("cost_pct")
    return f"bench: lineage_cost_pct={'nan' if cost is None else format(cost, '.2f')}"


def markdown(result: dict[str, Any]) -> list[str]:
    """The lineage paragraph of docs/benchmarks.md' generated block (nothing without the phase)."""
    lin = result.get("lineage") or {}
    if not lin.get("runs"):
        return []

    def rates(on: bool) -> str:
        return ", ".join(
            f"{r['records_per_s']:,.0f}" for r in lin["runs"] if r["lineage"] is on and r["label"] == WARM
        )

    cost = lin["cost_pct"]
    shown = "nan" if cost is None else f"{cost:+.1f}"
    load = lin.get("load_avg")
    busy = f", load average {load[0]:.1f} -> {load[1]:.1f} on {lin['cpus']} cores" if load else ""
    return [
        f"Lineage cost (measured {lin['finished_at']}{busy}): eo_partition at {lin['point']} "
        f"({lin['messages']:,} records, {lin['cap']:,} per partition per batch), one session, "
        f"{lin['warm_runs']} warm runs each with and without the `commits` rows, alternating: median "
        f"{lin['on_rps']:,.0f} rec/s with, {lin['off_rps']:,.0f} without: **{shown} %** "
        f"(target: <= {TARGET_PCT:.0f} %). Warm runs with: {rates(True)}; without: {rates(False)} rec/s.",
        "",
    ]
