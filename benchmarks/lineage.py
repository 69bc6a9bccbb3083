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

On two shared cores one run's records/s varies by +-10-15 % from the next (measured: warm runs of
the same setting from 32,000 to 53,000 rec/s), five times the target: the end-to-end figure cannot
tell 1 % from 5 %. So the phase also measures what the lineage adds where it is added, with
nothing else around it (:func:`claim_cost`): the guarded claim through the real commit path
(``txn_offsets.commit.commit_ranges``, the runs' ranges per transaction), with the lineage on and
off, alternating in blocks, in a schema of its own. Its extra milliseconds per range, times the
ranges a run commits, over the run's own time, is ``lineage_claim_cost_pct``: the lineage's cost
measured directly. The line also gives the spread of the end-to-end pairs (``lineage_pair_iqr_pct``,
the interquartile range of each round's with/without ratio), so a reader sees the noise.

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
import uuid
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from benchmarks import contenders, sink, store_scale
from benchmarks.contenders import Context
from benchmarks.dataset import Dataset
from benchmarks.resources import Sampler
from benchmarks.settings import EO_PARTITION, SPARK_TASK_SLOTS
from txn_offsets.commit import NoKafkaSource, commit_ranges
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import end_run, start_run
from txn_offsets.store.schema import tables_for

#: the claims are measured alone: no records are read, so there is no topic incarnation to prove
NO_RECORDS = NoKafkaSource("a benchmark of the claim alone: no records are read")

if TYPE_CHECKING:
    from benchmarks.bench import Bench
    from benchmarks.worker import Service

TARGET_PCT = 3.0
FIRST, WARM = "first", "warm"
CLAIM_TRANSACTIONS = 300  # per block of claim_cost
CLAIM_BLOCKS = 6  # per setting, alternating


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
    per_transaction = max(1, point.partitions // SPARK_TASK_SLOTS)  # a task's ranges, one transaction
    claims = claim_cost(bench.db, ranges_per_transaction=per_transaction)
    print(
        f"bench: lineage claims ({per_transaction} ranges per transaction): "
        f"{claims['on_ms_per_range']:.3f} ms per range with, {claims['off_ms_per_range']:.3f} without",
        flush=True,
    )
    load.append(os.getloadavg()[0])
    result = summary(runs, claims)
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


def summary(runs: list[dict[str, Any]], claims: dict[str, Any] | None = None) -> dict[str, Any]:
    """Median warm records/s with and without the lineage and the cost in %; the spread of the
    rounds' pairs; with `claims` (:func:`claim_cost`) the lineage's cost measured directly: its extra
    ms per range x the ranges an on-run committed, over the median off-run's seconds, in %."""

    def warm(on: bool) -> list[dict[str, Any]]:
        return [r for r in runs if r["lineage"] is on and r["label"] == WARM]

    on, off = [r["records_per_s"] for r in warm(True)], [r["records_per_s"] for r in warm(False)]
    on_rps = statistics.median(on) if on else None
    off_rps = statistics.median(off) if off else None
    cost = None if on_rps is None or not off_rps else (1 - on_rps / off_rps) * 100
    warm_runs = min(len(on), len(off))
    # round k's pair: warm runs 2k and 2k+1 in run order, one of each setting
    ordered = [r for r in runs if r["label"] == WARM]
    pairs = []
    for a, b in zip(ordered[::2], ordered[1::2], strict=False):
        with_, without = (a, b) if a["lineage"] else (b, a)
        pairs.append((1 - with_["records_per_s"] / without["records_per_s"]) * 100)
    iqr = None
    if len(pairs) >= 2:
        q = statistics.quantiles(pairs, n=4, method="inclusive")
        iqr = q[2] - q[0]
    out: dict[str, Any] = {
        "runs": runs,
        "on_rps": on_rps,
        "off_rps": off_rps,
        "cost_pct": cost,
        "warm_runs": warm_runs,
        "pair_pcts": pairs,
        "pair_iqr_pct": iqr,
        "claims": claims,
        "claim_cost_pct": None,
    }
    off_runs = warm(False)
    if claims and off_runs and warm(True):
        ranges = statistics.median(r["commit_rows"] for r in warm(True))
        seconds = statistics.median(r["seconds"] for r in off_runs)
        extra_s = max(0.0, claims["on_ms_per_range"] - claims["off_ms_per_range"]) * ranges / 1000
        out["claim_cost_pct"] = extra_s / seconds * 100
    return out


def claim_cost(
    db: DatabaseSettings,
    *,
    ranges_per_transaction: int,
    transactions: int = CLAIM_TRANSACTIONS,
    blocks: int = CLAIM_BLOCKS,
) -> dict[str, Any]:
    """Milliseconds per range of the guarded claim (``commit_ranges``: one transaction of
    `ranges_per_transaction` ranges, no user write) with the lineage on and off: `blocks` blocks of
    `transactions` each per setting, alternating which goes first, in a schema of its own (dropped
    afterwards); the median block of each. Returns ``{"on_ms_per_range", "off_ms_per_range",
    "ranges_per_transaction", "transactions", "blocks", "on_blocks", "off_blocks"}``."""
    times: dict[bool, list[float]] = {True: [], False: []}
    per_transaction = ranges_per_transaction
    with store_scale.scratch_schema(db, "lin") as (scratch, engine):
        for b in range(blocks):
            for on in (False, True) if b % 2 == 0 else (True, False):
                settings = dataclasses.replace(scratch, lineage=on)
                job = f"lin-{uuid.uuid4().hex[:8]}"
                run = start_run(Store(engine, settings), job)
                keys = {("lin-topic", p): 0 for p in range(ranges_per_transaction)}
                with engine.begin() as conn:
                    offset_rows.seed_offsets(conn, settings, job, keys, reason="bench", actor="bench")
                store = Store(engine, settings)
                t0 = time.perf_counter()
                for i in range(transactions):
                    start, until = i * 100, (i + 1) * 100
                    ranges = [OffsetRange("lin-topic", p, start, until) for p in range(per_transaction)]
                    commit_ranges(store, run, ranges, source=NO_RECORDS)
                seconds = time.perf_counter() - t0
                end_run(Store(engine, settings), run)
                times[on].append(seconds * 1000 / (transactions * ranges_per_transaction))
    return {
        "on_ms_per_range": statistics.median(times[True]),
        "off_ms_per_range": statistics.median(times[False]),
        "ranges_per_transaction": ranges_per_transaction,
        "transactions": transactions,
        "blocks": blocks,
        "on_blocks": times[True],
        "off_blocks": times[False],
    }


def line(lineage: dict[str, Any]) -> str:
    def pct(key: str) -> str:
        value = lineage.get(key)
        return "nan" if value is None else format(value, ".2f")

    return (
        f"bench: lineage_cost_pct={pct('cost_pct')} lineage_pair_iqr_pct={pct('pair_iqr_pct')} "
        f"lineage_claim_cost_pct={pct('claim_cost_pct')}"
    )


def markdown(result: dict[str, Any]) -> list[str]:
    """The lineage paragraph of docs/benchmarks.md' generated block (nothing without the phase)."""
    lin = result.get("lineage") or {}
    if not lin.get("runs"):
        return []

    def rates(on: bool) -> str:
        return ", ".join(
            f"{r['records_per_s']:,.0f}" for r in lin["runs"] if r["lineage"] is on and r["label"] == WARM
        )

    def pct(key: str, fmt: str = "+.1f") -> str:
        value = lin.get(key)
        return "nan" if value is None else format(value, fmt)

    load = lin.get("load_avg")
    busy = f", load average {load[0]:.1f} -> {load[1]:.1f} on {lin['cpus']} cores" if load else ""
    text = [
        f"Lineage cost (measured {lin['finished_at']}{busy}): eo_partition at {lin['point']} "
        f"({lin['messages']:,} records, {lin['cap']:,} per partition per batch), one session, "
        f"{lin['warm_runs']} warm runs each with and without the `commits` rows, alternating: median "
        f"{lin['on_rps']:,.0f} rec/s with, {lin['off_rps']:,.0f} without: {pct('cost_pct')} % end to end, "
        f"but the rounds' pairs spread over {pct('pair_iqr_pct', '.1f')} points (interquartile range; "
        f"pairs: {', '.join(f'{p:+.1f}' for p in lin.get('pair_pcts') or [])} %): run-to-run noise on "
        f"this machine, larger than the target. Warm runs with: {rates(True)}; "
        f"without: {rates(False)} rec/s.",
    ]
    claims = lin.get("claims")
    if claims:
        text.append(
            f"Measured directly (the guarded claim through `commit_ranges`, "
            f"{claims['ranges_per_transaction']} ranges per transaction as a task of these runs "
            f"commits them, {claims['blocks']} alternating blocks of {claims['transactions']} "
            f"transactions per setting): {claims['on_ms_per_range']:.3f} ms per range with the lineage, "
            f"{claims['off_ms_per_range']:.3f} without; times the ranges a run commits, over a run's "
            f"time: **{pct('claim_cost_pct', '.2f')} %** "
            f"of records/s (target: <= {TARGET_PCT:.0f} %)."
        )
    return [" ".join(text), ""]
