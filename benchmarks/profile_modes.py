"""Where each mode's time goes, beside PartitionWriter's on the same data: py-spy over the process tree.

One process holds one SparkSession that also serves Spark Connect (as the modes phase's worker,
:class:`benchmarks.worker.Service`), a topic of 8 partitions, and runs each contender asked for: a
first run (not profiled), then ``--runs`` runs alternating over the contenders, each under
``py-spy record --subprocesses`` (CPU samples of the driver and of every Python worker; the JVM is
not Python and shows only as its share of the process tree's CPU). Printed per contender: wall
seconds, CPU s / 1k records (the whole tree, as the bench counts it), py-spy's samples by process
(driver / Python workers), and the functions with the most samples (inclusive) in each.

    python -m benchmarks.profile_modes --records 48000 --cap 1000 --runs 2
    python -m benchmarks.profile_modes --contenders eo_partition,eo_frame --raw /tmp/prof
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import modes
from benchmarks.dataset import delete_topics, produce_dataset
from benchmarks.settings import EO_PARTITION, Point
from benchmarks.worker import Service, Spec
from examples import migrate as examples_migrate
from txn_offsets import from_env
from txn_offsets.config import DatabaseSettings
from txn_offsets.devstack.spark_kafka import spark_kafka_jars
from txn_offsets.store import migrate

PY_SPY = Path(sys.executable).with_name("py-spy")


def record(pid: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` and its subprocesses (CPU samples, raw stacks) into `out`."""
    command = [str(PY_SPY), "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
    command += ["--rate", str(rate), "--format", "raw", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def summarise(raw: Path, top: int) -> dict[str, Any]:
    """Samples per process kind and the functions seen in most samples (inclusive) per kind."""
    samples: collections.Counter[str] = collections.Counter()
    functions: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        # with --subprocesses each stack starts with its process's ancestry: "process <pid>:<argv>"
        own = max(i for i, f in enumerate(frames) if f.startswith("process ")) if frames else 0
        kind = _kind(frames[own])
        samples[kind] += int(count)
        if any("exec_module" in f or "_compile_source" in f for f in frames[own + 1 :]):
            samples[f"{kind}: importing modules"] += int(count)  # a new process's imports
        if any("Sampler._sample" in f for f in frames[own + 1 :]):
            samples[f"{kind}: the bench's /proc sampler"] += int(count)
        for name in {_function(f) for f in frames[own + 1 :]}:
            functions[kind][name] += int(count)
    return {
        "samples": dict(samples),
        "top": {kind: counter.most_common(top) for kind, counter in functions.items()},
    }


def _kind(process: str) -> str:
    if "pyspark.daemon" in process or "pyspark.worker" in process:
        return "python workers"
    if "java" in process:
        return "other python"
    return "driver"


def _function(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:line)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    short = "/".join(Path(path).parts[-2:]) if path else ""
    return f"{name} ({short})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--contenders", default=",".join(modes.CONTENDERS))
    parser.add_argument("--records", type=int, default=48_000)
    parser.add_argument("--cap", type=int, default=1_000, help="records per partition per batch")
    parser.add_argument("--runs", type=int, default=2, help="profiled runs of each contender")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--raw", type=Path, default=None, help="py-spy's raw stacks (default: a new temporary directory)"
    )
    args = parser.parse_args(argv)
    if not PY_SPY.exists():
        print(
            f"profile_modes: py-spy is not installed ({PY_SPY} not found): "
            "install the dev extra (pip install -e '.[dev]', as make install does)",
            file=sys.stderr,
        )
        return 2
    contenders = [c for c in args.contenders.split(",") if c]
    if args.raw is None:
        args.raw = Path(tempfile.mkdtemp(prefix="profile-modes-"))
    args.raw.mkdir(parents=True, exist_ok=True)
    db, kafka = from_env()
    db = DatabaseSettings(db.url, schema=f"bench_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(db)
    examples_migrate.upgrade(db)
    jars = tuple(str(p) for p in spark_kafka_jars(timeout_s=600))
    data = produce_dataset(kafka, 8, args.records)
    point = Point(8, args.cap, data.messages)
    service = Service(Spec(EO_PARTITION, db, kafka, jars, connect=True))
    try:
        service.start()
        for contender in contenders:  # first runs: Python workers, plans, JIT
            service.run(point=point, data=data, label="first", contender=contender)
        for k in range(args.runs):
            for contender in contenders if k % 2 == 0 else contenders[::-1]:
                out = args.raw / f"{contender}-{k}.txt"
                service.keep_warm()  # every pool of Python workers alive, as in the modes phase
                spy = record(os.getpid(), out, args.rate)
                time.sleep(1.0)  # py-spy attached
                try:
                    numbers = service.run(point=point, data=data, label="warm", contender=contender)
                finally:
                    stop(spy)
                found = summarise(out, args.top)
                print(
                    f"== {contender} run {k}: {numbers['seconds']:.2f}s "
                    f"{numbers['records_per_s']:,.0f} rec/s "
                    f"batches {numbers['batches']} cpu {numbers['cpu_s_per_1k']:.3f} s/1k "
                    f"samples {found['samples']}",
                    flush=True,
                )
                for kind, functions in found["top"].items():
                    print(f"   -- {kind}")
                    for name, count in functions:
                        print(f"      {count:6d}  {name}")
    finally:
        service.close()
        delete_topics(kafka, [data.topic])
        from sqlalchemy import text

        with service.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{db.schema}" CASCADE'))
        service.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
