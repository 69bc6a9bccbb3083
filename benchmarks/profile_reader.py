"""The reader's per-record cost in one process, against the raw confluent-kafka loop of the reader
limit (benchmarks/limits.py), on the same topic, alternating, in the same run.

    python -m benchmarks.profile_reader                       # a fresh 200,000-record topic, 8 partitions
    python -m benchmarks.profile_reader --baseline HEAD~1     # also the reader as it was at that commit
    python -m benchmarks.profile_reader --profile txn         # cProfile of one variant, top functions

Variants (each: read every committed record of the topic, decode with examples/pageviews.decode,
aggregate with examples/windowed_counts.aggregate, check the result against the oracle):

* ``raw``       limits.scan: one Consumer on all partitions, what it has fetched (<= 10,000) at a time,
                Record per message;
* ``txn``       txn_offsets.kafka.reader.read_range over each partition's whole range, in turn;
* ``writer``    the same ranges through PartitionWriter.prepare and the executor's record counter
                (what a PartitionWriter task does per record, minus the transaction);
* ``base``      read_range as it was at ``--baseline`` (loaded from git), as ``txn``.

Reported per variant: the best and median wall time and process CPU time, records/s, and
CPU microseconds per record, over ``--rounds`` rounds, the variants' order rotated each round.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import limits
from benchmarks.contenders import Context
from benchmarks.dataset import Dataset, delete_topics, expected_of, produce_dataset
from examples import pageviews, windowed_counts
from txn_offsets import from_env
from txn_offsets.commit.staging import Counting
from txn_offsets.kafka import reader as txn_reader
from txn_offsets.kafka.metadata import watermarks
from txn_offsets.ranges import OffsetRange

REPO = Path(__file__).resolve().parent.parent
Partials = windowed_counts.Partials


def _merge(totals: Partials, partials: Partials) -> None:
    for key, (views, duration) in partials.items():
        acc = totals.setdefault(key, [0, 0])
        acc[0] += views
        acc[1] += duration


def raw(ctx: Context, _ranges: list[OffsetRange]) -> tuple[int, Partials]:
    totals: Partials = {}
    n = 0
    for batch in limits.scan(ctx):
        _merge(totals, windowed_counts.aggregate(pageviews.decode(limits._record(m)) for m in batch))
        n += len(batch)
    return n, totals


def _ranges_with(read_range: Callable[..., Iterator[Any]]) -> Callable[..., tuple[int, Partials]]:
    def run(ctx: Context, ranges: list[OffsetRange]) -> tuple[int, Partials]:
        totals: Partials = {}
        n = 0
        for rng in ranges:
            counted = Counting(read_range(ctx.kafka, rng))
            _merge(totals, windowed_counts.aggregate(pageviews.decode(r) for r in counted))
            n += counted.n
        return n, totals

    return run


def writer(ctx: Context, ranges: list[OffsetRange]) -> tuple[int, Partials]:
    totals: Partials = {}
    n = 0
    for rng in ranges:
        counted = Counting(txn_reader.read_range(ctx.kafka, rng))
        _merge(totals, windowed_counts.WRITER.prepare(counted, None))
        if counted.unread():
            raise RuntimeError("records left unread")
        n += counted.n
    return n, totals


def baseline_module(rev: str) -> types.ModuleType:
    """txn_offsets/kafka/reader.py as it was at `rev`, as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:txn_offsets/kafka/reader.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-reader-")) / "reader_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("bench_reader_baseline", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="a git revision: also measure its reader")
    parser.add_argument("--variants", default="raw,txn,writer,base")
    parser.add_argument("--profile", default=None, help="cProfile one variant once, print the top")
    args = parser.parse_args(argv)

    _, kafka = from_env()
    variants: dict[str, Callable[[Context, list[OffsetRange]], tuple[int, Partials]]] = {
        "raw": raw,
        "txn": _ranges_with(txn_reader.read_range),
        "writer": writer,
    }
    if args.baseline:
        variants["base"] = _ranges_with(baseline_module(args.baseline).read_range)
    chosen = [v for v in args.variants.split(",") if v in variants]
    data: Dataset = produce_dataset(kafka, args.partitions, args.messages)
    print(f"produced {data.messages:,} records (+{data.aborted:,} aborted) to {data.topic}", flush=True)
    try:
        ctx = Context(db=None, kafka=kafka, topic=data.topic, partitions=args.partitions, cap=0)  # type: ignore[arg-type]
        parts = [(data.topic, p) for p in range(args.partitions)]
        ranges = [
            OffsetRange(t, p, low, end) for (t, p), (low, end) in sorted(watermarks(kafka, parts).items())
        ]
        for name in chosen:  # warm up: connections, imports, page cache
            variants[name](ctx, ranges)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            variants[args.profile](ctx, ranges)
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
            print(out.getvalue())
        wall: dict[str, list[float]] = {n: [] for n in chosen}
        cpu: dict[str, list[float]] = {n: [] for n in chosen}
        for round_ in range(args.rounds):
            order = chosen[round_ % len(chosen) :] + chosen[: round_ % len(chosen)]
            for name in order:
                t0, c0 = time.perf_counter(), time.process_time()
                n, totals = variants[name](ctx, ranges)
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                if n != data.messages or expected_of(totals) != data.expected:
                    raise SystemExit(f"{name}: wrong result ({n} records, {data.messages} expected)")
        print(f"{'variant':8} {'best s':>8} {'median s':>9} {'rec/s (best)':>13} {'CPU us/rec':>11}")
        base_rps = data.messages / min(wall["raw"]) if "raw" in wall else None
        for name in chosen:
            best = min(wall[name])
            rps = data.messages / best
            us = statistics.median(cpu[name]) / data.messages * 1e6
            vs = f"  {rps / base_rps:.2f}x raw" if base_rps else ""
            print(
                f"{name:8} {best:8.2f} {statistics.median(wall[name]):9.2f} {rps:13,.0f} {us:11.2f}{vs}",
                flush=True,
            )
    finally:
        delete_topics(kafka, [data.topic])
    return 0


if __name__ == "__main__":
    sys.exit(main())
