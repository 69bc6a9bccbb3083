"""Fault injectors that run inside the job: the counting writer and where it breaks on purpose.

Everything here is pickled to Spark's Python workers, so the injectors are frozen dataclasses
defined at module level. Which range a fault hits is a pure function of (seed, range): a run is
reproducible from its seed, and a Spark retry of the same range sees the same decision. Executor
faults (F2) fire on the first attempt of a task only, so Spark's own retry (``local[2,3]``: up to 3
attempts) is what has to recover; driver kills (F1) and frozen workers (F13) are counted across
worker processes through files, because Python workers share nothing else.

A task's first fault ends its attempt: a range decided for a later point (``after_commit``) fires
nothing when another range of the same task, or its own first record (``before_write`` is keyed by
it), failed first. F2 therefore runs one range per Spark task, forces one range per point
(`forced`) and, with `record`, has the workers log what really fired (``run_dir/faults``) and every
after_commit call with its outcome and attempt (``run_dir/after-commit``): its checks use those
logs, never the seeded decisions alone.

Fault points, in the order a range lives through them::

    [hold (F12b)] -> read -> prepare (decode, aggregate)  [before_write]
         -> transaction: claim           [after_claim, crash_after_claim, freeze (F13)]
         -> the user's write             [swallowed error (F14), after_write]
         -> COMMIT                       [commit: the driver is killed just before]
         -> after_commit hook            [after_commit]
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from txn_offsets.kafka.records import Record
from txn_offsets.ranges import OffsetRange
from txn_offsets.upserts import upsert_add

Key = tuple[str, int, int]  # (topic, partition, offset): what a fault decision is keyed by
Decoded = tuple[str, int, int, str]  # (topic, partition, offset, user)

__all__ = [
    "EXECUTOR_POINTS",
    "KILL_POINTS",
    "AfterCommit",
    "AfterCommitCall",
    "CountUsers",
    "CountWrite",
    "FaultPlan",
    "Fired",
    "after_commit_calls",
    "decode_user",
    "fired_faults",
    "frozen_key",
    "frozen_workers",
    "tables",
]

# F2: where an executor task fails on its first attempt
EXECUTOR_POINTS = ("before_write", "after_claim", "crash_after_claim", "after_write", "after_commit")
# F1: where the driver is killed (-9); "timer" and "plan" are driven from outside / the driver
KILL_POINTS = ("timer", "plan", "read", "after_claim", "commit", "after_commit")


class InjectedFault(RuntimeError):
    """A failure the chaos harness caused on purpose (never a library error)."""


@dataclass(frozen=True)
class FaultPlan:
    """What to break in one job process. The default breaks nothing."""

    seed: int = 0
    # F2: fraction of ranges whose first attempt fails, at one of `executor_points` (seeded)
    executor_rate: float = 0.0
    executor_points: tuple[str, ...] = ()
    # F2: ranges whose first attempt fails at a given point whatever the seeded draw says, each as
    # (topic, partition, start, first record offset, point); the range's other key draws nothing
    forced: tuple[tuple[str, int, int, int, str], ...] = ()
    # F2: log every executor fault that fires (run_dir/faults) and every after_commit call with
    # its outcome and attempt (run_dir/after-commit)
    record: bool = False
    # F1: kill the driver (pid) with SIGKILL at the `kill_after`-th range event at `kill_point`
    kill_point: str = ""
    kill_after: int = 0
    driver_pid: int = 0
    run_dir: str = ""
    # F3/F5/F6: widen windows so external faults land inside transactions and COMMITs
    write_sleep_s: float = 0.0
    commit_probe: bool = False
    # F6: every n-th range (seeded) is slow before its transaction, a straggler for speculation
    straggler_rate: float = 0.0
    straggler_s: float = 0.0
    # F13: a seeded share of ranges SIGSTOPs its Python worker while it holds the claim (first
    # attempt of a range only, at most `freeze_limit` per run; pids in run_dir/frozen-<n>)
    freeze_after_claim_rate: float = 0.0
    freeze_limit: int = 1
    # F14: the write runs a failing statement and swallows the error, then returns normally
    swallow_db_error: bool = False
    # F12b: once `hold_after_batches` batches committed (run_dir/batches), every range waits
    # BEFORE it reads a record (a file run_dir/held-* says so) until run_dir/resume exists
    hold_after_batches: int = 0

    def _rng(self, key: Key, what: str) -> random.Random:
        return random.Random(f"{self.seed}:{what}:{key[0]}:{key[1]}:{key[2]}")

    def executor_point(self, key: Key) -> str | None:
        """The F2 point the range at `key` fails at on its first attempt (None: it does not)."""
        for topic, part, start, first, point in self.forced:
            if (key[0], key[1]) == (topic, part) and key[2] in (start, first):
                # before_write is keyed by the range's first record, every other point by its start
                return point if key[2] == (first if point == "before_write" else start) else None
        if not self.executor_points or self.executor_rate <= 0:
            return None
        r = self._rng(key, "f2")
        if r.random() >= self.executor_rate:
            return None
        return r.choice(self.executor_points)

    def at(self, point: str, key: Key) -> None:
        """Called by the job at each fault point; `key` = (topic, partition, first offset)."""
        if point == self.kill_point and self.driver_pid:
            self._maybe_kill_driver(point, key)
        if self.executor_point(key) == point and _first_attempt():
            if self.record and self.run_dir:
                line = f"{point} {key[0]} {key[1]} {key[2]} {_attempt_number()}"
                _append(Path(self.run_dir) / "faults", line)  # before os._exit: it must be on disk
            if point == "crash_after_claim":
                # the Python worker dies with the transaction open: Postgres rolls it back when
                # the socket closes, Spark sees a lost worker and retries the task
                os._exit(17)
            raise InjectedFault(f"chaos F2: {point} of {key} (first attempt)")

    def _maybe_kill_driver(self, point: str, key: Key) -> None:
        log = Path(self.run_dir) / "range-events"
        with log.open("a") as fh:  # one short line per event: appends of this size are atomic
            fh.write(f"{point} {key}\n")
        if len(log.read_text().splitlines()) == self.kill_after:
            (Path(self.run_dir) / "killed-at").write_text(f"{point} {key}\n")
            os.kill(self.driver_pid, signal.SIGKILL)
            # give the kill time to land before the task goes on (at "commit": the COMMIT then
            # races the driver's death, which is the point)
            time.sleep(0.2)

    def freeze(self, key: Key) -> None:
        """F13: on the first attempt of a seeded share of ranges, stop this Python worker (SIGSTOP)
        with the claim held and the transaction open. Before stopping it takes a free slot file
        ``run_dir/frozen-<n>`` (O_EXCL: at most `freeze_limit` freezes per run) holding
        ``topic partition start pid starttime``; a range that froze once never freezes again,
        even when the runner plans it again in a new Spark job (whose attempt number is 0 too)."""
        if self.freeze_after_claim_rate <= 0 or not self.run_dir or not _first_attempt():
            return
        if self._rng(key, "f13").random() >= self.freeze_after_claim_rate:
            return
        slots = [Path(self.run_dir) / f"frozen-{n}" for n in range(self.freeze_limit)]
        if any(frozen_key(slot) == key for slot in slots):
            return
        pid = os.getpid()
        line = f"{key[0]} {key[1]} {key[2]} {pid} {_start_time(pid)}\n"
        for slot in slots:
            try:
                fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(line)
            os.kill(pid, signal.SIGSTOP)  # resumes only if someone sends SIGCONT (nobody does)
            return

    def hold(self) -> None:
        """F12b: hold the range's task before its first read, after `hold_after_batches` committed
        batches, until the harness writes ``run_dir/resume`` (bounded: 180 s). While every task
        of the batch is held the stored offsets cannot move, and whatever the harness does to
        the topic meanwhile (re-create it) happens between the batch's plan and its read."""
        if self.hold_after_batches <= 0 or not self.run_dir:
            return
        run_dir = Path(self.run_dir)
        batches = run_dir / "batches"
        done = len(batches.read_text().splitlines()) if batches.exists() else 0
        if done < self.hold_after_batches or (run_dir / "resume").exists():
            return
        (run_dir / f"held-{os.getpid()}-{time.monotonic_ns()}").write_text("")
        deadline = time.monotonic() + 180
        while not (run_dir / "resume").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def straggle(self, key: Key) -> None:
        """F6: a seeded share of ranges is slow on its FIRST attempt only, so a speculative copy
        (attempt >= 1, on another host) overtakes it and commits first, and the original must
        then find its range already committed. Every attempt is logged to CHAOS_ATTEMPTS_LOG."""
        if self.straggler_rate <= 0:
            return
        attempt = _attempt_number()
        log = os.environ.get("CHAOS_ATTEMPTS_LOG")
        if log:
            with Path(log).open("a") as fh:  # small appends: atomic enough across processes
                fh.write(f"{key[0]} {key[1]} {key[2]} {attempt}\n")
        if attempt == 0 and self._rng(key, "f6").random() < self.straggler_rate:
            time.sleep(self.straggler_s)


def _attempt_number() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return 0 if ctx is None else int(ctx.attemptNumber())


def _first_attempt() -> bool:
    return _attempt_number() == 0


def _append(path: Path, line: str) -> None:
    """One short line appended with O_APPEND (atomic across the Python workers at this size)."""
    with path.open("a") as fh:
        fh.write(line + "\n")


@dataclass(frozen=True)
class Fired:
    """An executor fault that fired (``run_dir/faults``): its point, key and task attempt."""

    point: str
    key: Key
    attempt: int


def fired_faults(run_dir: Path) -> list[Fired]:
    """The executor faults that fired in `run_dir` (FaultPlan.record), in the order they fired."""
    path = run_dir / "faults"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        point, topic, part, off, attempt = line.split()
        out.append(Fired(point, (topic, int(part), int(off)), int(attempt)))
    return out


@dataclass(frozen=True)
class AfterCommitCall:
    """One call of the after_commit hook (``run_dir/after-commit``): after its range's COMMIT, or
    after a retry found the range committed already."""

    key: Key
    until: int
    outcome: str
    attempt: int


def after_commit_calls(run_dir: Path) -> list[AfterCommitCall]:
    """Every after_commit call in `run_dir` (FaultPlan.record), in call order."""
    path = run_dir / "after-commit"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        topic, part, start, until, outcome, attempt = line.split()
        out.append(AfterCommitCall((topic, int(part), int(start)), int(until), outcome, int(attempt)))
    return out


def _start_time(pid: int) -> int:
    """The start time of `pid` (clock ticks after boot, /proc/<pid>/stat field 22): with the pid,
    it names one process, never a recycled pid."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rfind(")") + 2 :].split()[19])


def frozen_key(slot: Path) -> Key | None:
    """The range an F13 slot file froze (None: the slot is free or still being written)."""
    parts = slot.read_text().split() if slot.exists() else []
    return (parts[0], int(parts[1]), int(parts[2])) if len(parts) == 5 else None


def frozen_workers(run_dir: Path) -> list[tuple[int, int]]:
    """(pid, start time) of every worker F13 stopped in `run_dir`."""
    out = []
    for slot in sorted(run_dir.glob("frozen-*")):
        parts = slot.read_text().split()
        if len(parts) == 5:
            out.append((int(parts[3]), int(parts[4])))
    return out


def decode_user(record: Record) -> Decoded:
    """The page view's user (its JSON ``u``) with the record's coordinates; anything else is
    poison and rejects the range."""
    from examples.pageviews import decode

    return record.topic, record.partition, record.offset, decode(record).user


@dataclass(frozen=True)
class Tables:
    counts: sa.Table
    applied: sa.Table
    probe: sa.Table


@functools.cache
def tables(schema: str) -> Tables:
    """The harness's result tables in `schema` (beside the library's offsets tables)."""
    md = sa.MetaData(schema=schema)
    counts = sa.Table(
        "chaos_counts",
        md,
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("k", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    # one row per applied range, written in the range's transaction: no key, so an applied-twice
    # range shows up as two rows instead of being hidden by a constraint error
    applied = sa.Table(
        "chaos_applied",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("start_off", sa.BigInteger, nullable=False),
        sa.Column("until_off", sa.BigInteger, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
    )
    # F3: a deferred constraint trigger on this table sleeps at COMMIT time, so a COMMIT can be
    # caught in flight by pg_terminate_backend
    probe = sa.Table(
        "chaos_commit_probe",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("start_off", sa.BigInteger, nullable=False),
    )
    return Tables(counts, applied, probe)


@dataclass(frozen=True)
class CountWrite:
    """The job's write: add the range's per-user counts, log the range, with faults in between."""

    schema: str
    plan: FaultPlan = field(default_factory=FaultPlan)

    def __call__(self, conn: sa.Connection, rng: OffsetRange, counts: collections.Counter[str]) -> None:
        t = tables(self.schema)
        self.plan.at("after_claim", _key(rng))  # commit_ranges claims before it calls the write
        self.plan.at("crash_after_claim", _key(rng))
        self.plan.freeze(_key(rng))
        rows = [{"topic": rng.topic, "k": k, "n": n} for k, n in counts.items()]
        upsert_add(conn, t.counts, rows, keys=["topic", "k"], add=["n"])
        conn.execute(
            sa.insert(t.applied).values(
                topic=rng.topic,
                part=rng.partition,
                start_off=rng.start,
                until_off=rng.until,
                records=sum(counts.values()),
            )
        )
        if self.plan.commit_probe:
            conn.execute(sa.insert(t.probe).values(topic=rng.topic, part=rng.partition, start_off=rng.start))
        if self.plan.swallow_db_error:
            # F14: user code that hides a database error. PostgreSQL has aborted the transaction,
            # so its COMMIT would be a silent ROLLBACK; the library must notice, not report success
            with contextlib.suppress(sa.exc.DBAPIError):
                conn.execute(sa.text("SELECT 1/0"))
        if self.plan.write_sleep_s:
            time.sleep(self.plan.write_sleep_s)  # keep the transaction open: F3 and F5 aim here
        self.plan.at("after_write", _key(rng))
        self.plan.at("commit", _key(rng))  # the last thing before commit_ranges COMMITs


@dataclass(frozen=True)
class CountUsers:
    """``aggregate``: count users before the transaction opens (the read and before-write points).

    ``aggregate`` is not told its range, so the fault key is the range's first record: the same
    on every attempt of the range. A range of markers and aborted records only has no key and
    no fault.
    """

    plan: FaultPlan = field(default_factory=FaultPlan)

    def __call__(self, values: Iterator[Decoded]) -> collections.Counter[str]:
        self.plan.hold()  # before the first record is read (the reader is lazy)
        counts: collections.Counter[str] = collections.Counter()
        key: Key | None = None
        for topic, part, off, user in values:
            if key is None:
                key = (topic, part, off)
                self.plan.at("read", key)
            counts[user] += 1
        if key is not None:
            self.plan.straggle(key)
            self.plan.at("before_write", key)
        return counts


@dataclass(frozen=True)
class AfterCommit:
    """``after_commit``: runs after COMMIT, before the task reports."""

    plan: FaultPlan

    def __call__(self, rng: OffsetRange, outcome: str) -> None:
        if self.plan.record and self.plan.run_dir:
            line = f"{rng.topic} {rng.partition} {rng.start} {rng.until} {outcome} {_attempt_number()}"
            _append(Path(self.plan.run_dir) / "after-commit", line)
        self.plan.at("after_commit", _key(rng))


def _key(rng: OffsetRange) -> Key:
    return rng.topic, rng.partition, rng.start
