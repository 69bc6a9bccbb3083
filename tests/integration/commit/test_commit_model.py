"""A model of the commit guard, checked step by step against the real PostgreSQL and Kafka (issue 41, item 4).

A Hypothesis state machine (:class:`CommitModel`) interleaves, over one or two tiny topics (one or two
partitions each) and two jobs that read them all:

* Kafka: committed and aborted transactions (a transactional producer), a partition added
  (``AdminClient.create_partitions``), a topic deleted and created again (a new incarnation);
* plans (``plan_batch``, with ``on_data_loss`` fail or skip and a per-partition cap), kept so that a
  later step can read and commit them: a straggler planned before another commit moved the offset;
* reads and commits through each mode's unit builder: a ``PartitionTask`` staged now and committed
  later, or run whole in-process (one transaction, or one per range); ``prepare_range`` + ``unit_of``
  (the low-latency follower's path) + ``commit_unit``; ``RealTimeSink`` fed rows as Spark's source
  would (closed at once, or left buffering while other steps move the offsets); ``commit_units`` over
  two units of the two jobs (a shared round). A staged unit stays available: committing it again is
  a retried task or a speculative copy;
* runs and admin moves: a newer run (``start_run(force=True)``: every unit of the older run is a
  zombie) and an audited reset (earliest, latest, an offset, a shift);
* a batch in flight across a newer run or a re-created topic: read (or a sink fed) before, committed
  after - the zombie, and the unit only the topic-incarnation proof stops.

The model predicts every answer: each plan's ranges, seeds and data-loss skips; the records each read
returns (offsets and values, so a record of the wrong incarnation shows); and each commit's outcome,
``committed`` / ``already_committed`` or the exact error class the protocol names (Fenced,
TopicChanged, OffsetsMovedOn, DataLoss from a plan, StreamDiverged and ConfigError from the sink's
process()). The units write into a results table keyed by (job, topic, topic id, partition, offset)
with no ON CONFLICT: a record written twice is a unique violation, so the commit fails (WriteFailed)
where the model says it succeeds. The topic id is part of the key because a re-created topic starts
its offsets at 0 again.

Left out on purpose: reading a range of a re-created topic that its new log does not cover yet (the
reader waits for the records until its stall bound: the reader's tests cover it), and a reset by
``--shift-by`` of a partition without a stored offset (a bug, see the regression test at the end).

After every step (``@invariant``):

* I1 - per job and partition the stored offset and its topic id are the model's, and the results
  table holds exactly the model's rows; for the incarnation each offset belongs to, those are the
  committed Kafka records below the stored offset, less the records an audited move skipped
  forward. A reset backwards is followed by what a user who replays does: the job's result rows of
  that partition at or above the new offset are deleted (by the test, mirrored in the model), so the
  records are counted again exactly once. The lineage (``commits``) has one row per committed range.
* I2 - an offset only moves backwards by an audited move (a ``reset`` or ``data_loss_skip`` row of
  ``offset_audit`` since the previous step), and the audit rows are exactly the moves the model made
  (seeds, new partitions, skips, resets).
* I3 - a commit that raised left the job's offsets, results and lineage as they were (checked around
  every failed commit, also when the write ran before the failure: the topic-incarnation proof).

``make test`` runs the short profile (:data:`SHORT`); ``make chaos`` the long one
(``pytest tests/integration/commit/test_commit_model.py -m slow``, :data:`LONG`, scaled by
TXN_OFFSETS_MODEL_EXAMPLES / TXN_OFFSETS_MODEL_STEPS). Each prints the examples and steps it ran.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.fix_services import TopicFactory
from tests.kafka_ends import settled_ends
from tests.kafka_topics import recreate_topic
from txn_offsets.admin.reset import ResetTarget, TargetKind, apply_reset, plan_reset
from txn_offsets.commit import Outcome, Unit, commit_unit, commit_units
from txn_offsets.commit.staging import Prepared, prepare_range, unit_of
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import (
    ConfigError,
    DataLoss,
    Fenced,
    OffsetConflict,
    OffsetsMovedOn,
    OffsetsRolledBack,
    StreamDiverged,
    TopicChanged,
    TxnOffsetsError,
)
from txn_offsets.kafka import metadata
from txn_offsets.kafka.described import TopicInfo
from txn_offsets.kafka.reader import read_range
from txn_offsets.kafka.records import Record
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
from txn_offsets.ranges import OffsetRange
from txn_offsets.spark.stream.realtime_sink import RealTimeSink
from txn_offsets.spark.tasks import PartitionTask, ReadOptions, TaskReport
from txn_offsets.store import migrate, offset_rows
from txn_offsets.store.database import engine_for, worker_engine
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, start_run
from txn_offsets.store.schema import tables_for

#: make test: ~10 examples of ~13 steps
SHORT = {"max_examples": 10, "stateful_step_count": 13, "recreations": 1}
#: make chaos: more and longer examples (TXN_OFFSETS_MODEL_EXAMPLES / _STEPS override)
LONG = {
    "max_examples": int(os.environ.get("TXN_OFFSETS_MODEL_EXAMPLES", "60")),
    "stateful_step_count": int(os.environ.get("TXN_OFFSETS_MODEL_STEPS", "40")),
    "recreations": 3,
}
READ = ReadOptions(batch_size=100, stall_timeout_s=20.0)
#: records per partition of one transaction
COUNTS = st.lists(st.integers(0, 3), min_size=2, max_size=2)
#: records that arrive before a batch: a transaction committed, or aborted, or none
ARRIVE = st.sampled_from(["committed", "aborted", None])
#: a batch of a job (read, or a sink fed) in flight across another step, and how it is read
IN_FLIGHT = st.none() | st.tuples(st.integers(0, 1), st.sampled_from(["staged task", "unit_of", "sink"]))
#: max_records_per_partition of a plan
CAPS = st.sampled_from([None, 1, 2, 3])
#: how a batch is read and committed
STAGES = st.sampled_from(["staged task", "unit_of"])
MODES = st.sampled_from(["task", "task per range", "staged task", "unit_of"])
#: a sink left open longer than this is closed as failed (its flusher commits by itself at 60 s)
SINK_MAX_AGE_S = 40.0
#: moves that may take an offset backwards
BACKWARDS = ("reset", "data_loss_skip")

Key = tuple[str, int]
Rows = dict[int, bytes]  # offset -> value of the records of one range
Values = list[tuple[int, bytes]]  # what _prepare makes of a range's records
Commit = Callable[[], "Outcome | TxnOffsetsError"]
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# the model


@dataclass
class Log:
    """One partition of one topic incarnation: Kafka's end (LSO, all transactions settled) and its
    committed records (aborted records and markers take offsets but are not here)."""

    end: int = 0
    committed: Rows = field(default_factory=dict)

    def records(self, start: int, until: int) -> Rows:
        return {o: v for o, v in self.committed.items() if start <= o < until}


@dataclass
class Incarnation:
    topic_id: str
    logs: list[Log]


@dataclass
class TopicModel:
    name: str
    current: Incarnation
    history: dict[str, Incarnation]  # every incarnation, by topic id

    def renew(self, topic_id: str, partitions: int) -> None:
        self.current = Incarnation(topic_id, [Log() for _ in range(partitions)])
        self.history[topic_id] = self.current


@dataclass
class JobModel:
    name: str
    run: Run  # the job's newest run (fenced once a reset bumped the generation)
    generation: int
    planned: bool = False  # the job row's first_plan_at is set
    rows: dict[Key, tuple[int, str]] = field(default_factory=dict)  # (offset, topic id)
    # records an audited move passed over forward, per (topic, topic id, partition)
    skipped: dict[tuple[str, str, int], list[tuple[int, int]]] = field(default_factory=dict)
    results: dict[tuple[str, str, int, int], bytes] = field(default_factory=dict)
    lineage: int = 0  # rows of the commits table

    @property
    def live(self) -> bool:
        return self.run.generation == self.generation


@dataclass(frozen=True)
class Planned:
    """A plan of job `j` (its ranges, the run that planned them), as a later step may commit it."""

    j: int
    run: Run
    ranges: tuple[OffsetRange, ...]


@dataclass
class Staged:
    """A unit read and prepared, and how to commit it (again, after it was: a retry)."""

    j: int
    mode: str
    run: Run
    ranges: tuple[OffsetRange, ...]
    read: dict[Key, Rows]  # what the read returned
    unit: Unit
    commit: Callable[[], Outcome | TxnOffsetsError]


@dataclass
class OpenSink:
    """A RealTimeSink that was fed rows and not closed yet: its groups as the sink saw them."""

    j: int
    sink: RealTimeSink
    groups: list[tuple[OffsetRange, Rows]]
    opened_at: float
    closed: bool = False


@dataclass
class Env:
    engine: sa.Engine
    db: DatabaseSettings
    kafka: KafkaSettings
    admin: AdminClient
    results: sa.Table
    recreations: int
    stats: collections.Counter[str] = field(default_factory=collections.Counter)
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)  # steps by what they did


def _predicted(  # noqa: PLR0911 - one return per answer of the commit shell
    jm: JobModel, run: Run, ranges: Sequence[OffsetRange], current_ids: dict[str, str]
) -> type[TxnOffsetsError] | Outcome:
    """What the commit shell answers for one unit (txn_offsets.commit: claim, classify, write, proof)."""
    if run.generation != jm.generation:
        return Fenced
    claimed = []
    for rng in sorted(ranges, key=lambda r: r.key):
        off, topic_id = jm.rows.get(rng.key, (None, None))
        if rng.topic_id is not None and topic_id != rng.topic_id:
            return TopicChanged
        if off == rng.until:
            claimed.append(False)
        elif off is None:
            return OffsetConflict
        elif off < rng.start:
            return OffsetsRolledBack
        elif off > rng.start:
            return OffsetsMovedOn
        else:
            claimed.append(True)
    if not any(claimed):
        return Outcome.ALREADY_COMMITTED
    if not all(claimed):
        return OffsetsMovedOn
    if any(current_ids.get(r.topic) != r.topic_id for r in ranges):  # the incarnation proof
        return TopicChanged
    return Outcome.COMMITTED


def _is_expected(exc: TxnOffsetsError, expected: type[TxnOffsetsError] | None) -> None:
    """`exc` is exactly the error the model predicted (None: it predicted success)."""
    assert expected is not None, f"{exc!r}: the model expected no error"
    assert type(exc) is expected, f"{exc!r}: the model expected {expected.__name__}"


def _one(values: Sequence[T], what: str) -> T:
    assert len(set(values)) == 1, f"{what} differ within one transaction: {values}"
    return values[0]


def _reported(reports: Sequence[TaskReport]) -> Outcome | TxnOffsetsError:
    """A transaction's reports (a PartitionTask) as one answer: the outcome, or the error."""
    errors = [r.error for r in reports if r.error is not None]
    if errors:
        assert len(errors) == len(reports), reports
        _one([type(e) for e in errors], "errors")
        return errors[0]
    return _one([r.outcome for r in reports], "outcomes")


class CommitModel(RuleBasedStateMachine):
    """See the module docstring. Jobs are 0 and 1; topics 0 and (if the example has two) 1."""

    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.topics: list[TopicModel] = []
        self.jobs: list[JobModel] = []
        self.plans: list[Planned] = []  # every plan made: a later step may read and commit it
        self.staged: list[Staged] = []  # every unit read: a later step may commit it (again)
        self.open_sinks: list[OpenSink] = []
        self.audits: list[tuple[str, str, int, int | None, int, str]] = []  # expected since last check
        self.audit_seen = 0
        self.seen_offsets: dict[tuple[str, Key], int] = {}
        self.producer: Producer | None = None
        self.recreations = 0
        self.epoch = 0

    # -- setup ---------------------------------------------------------------------------------

    @initialize(
        sizes=st.lists(st.integers(1, 2), min_size=1, max_size=2),
        transactions=st.lists(st.tuples(COUNTS, st.booleans()), min_size=1, max_size=3),
        cap=CAPS,
    )
    def setup(self, sizes: list[int], transactions: list[tuple[list[int], bool]], cap: int | None) -> None:
        """Fresh topics (one or two, of one or two partitions) holding a few transactions, and two
        jobs with a run each and a first plan (kept for later steps)."""
        self.env.stats["examples"] += 1
        for n in sizes:
            name = f"model-{uuid.uuid4().hex[:12]}"
            new = NewTopic(name, num_partitions=n, replication_factor=1)
            self.env.admin.create_topics([new])[name].result(timeout=30)
            info = self._described(name, n)
            self.topics.append(TopicModel(name, Incarnation(info.topic_id, []), {}))
            self.topics[-1].renew(info.topic_id, n)
        self._new_producer()
        for t in range(len(self.topics)):
            for counts, commit in transactions:
                self._produce(t, counts, commit=commit)
        self.audit_seen = self._max_audit_id()
        for j in range(2):
            name = f"model-job-{uuid.uuid4().hex[:10]}"
            run = start_run(Store(self.env.engine, self.env.db), name)
            self.jobs.append(JobModel(name, run, run.generation))
            self._plan(j, cap, skip=False)  # the first plan seeds the offsets (the start policy)

    def teardown(self) -> None:
        for opened in self.open_sinks:
            if not opened.closed:
                opened.closed = True
                opened.sink.close(RuntimeError("the example is over"))
        if self.topics:
            names = [t.name for t in self.topics]
            for fut in self.env.admin.delete_topics(names, operation_timeout=30).values():
                with contextlib.suppress(KafkaException):
                    fut.result(timeout=30)

    # -- Kafka ---------------------------------------------------------------------------------

    @rule(t=st.integers(0, 1), counts=COUNTS, commit=st.booleans())
    def produce(self, t: int, counts: list[int], commit: bool) -> None:
        """One Kafka transaction over the topic's partitions, committed or aborted."""
        self._produce(t, counts, commit=commit)
        self._step("produce " + ("committed" if commit else "aborted"))

    @precondition(lambda self: any(len(t.current.logs) == 1 for t in self.topics))
    @rule(t=st.integers(0, 1))
    def add_partition(self, t: int) -> None:
        narrow = [x for x in self.topics if len(x.current.logs) == 1]
        topic = narrow[t % len(narrow)]
        self.env.admin.create_partitions([NewPartitions(topic.name, 2)])[topic.name].result(timeout=30)
        self._described(topic.name, 2)
        settled_ends(self.env.kafka, topic.name, 2)  # the new partition has a leader
        topic.current.logs.append(Log())
        self._new_producer()
        self._step("add a partition")

    @precondition(lambda self: self.recreations < self.env.recreations)
    @rule(t=st.integers(0, 1), in_flight=IN_FLIGHT)
    def recreate(self, t: int, in_flight: tuple[int, str] | None) -> None:
        """Delete the topic and create it again under its name: a new incarnation, an empty log.
        `in_flight` (job, mode): a batch of the job read before and committed after (the
        incarnation proof), or a sink fed before and closed after."""
        flight = self._take_off(in_flight, t)
        topic = self._topic(t)
        old, n = topic.current.topic_id, len(topic.current.logs)
        recreate_topic(self.env.admin, topic.name, n)
        info = self._described(topic.name, n, other_than=old)
        topic.renew(info.topic_id, n)
        self.recreations += 1
        self._new_producer()
        self._step(f"re-create a topic{self._land(flight)}")

    # -- runs and admin ------------------------------------------------------------------------

    @rule(j=st.integers(0, 1), first=st.none() | MODES, in_flight=IN_FLIGHT)
    def new_run(self, j: int, first: str | None, in_flight: tuple[int, str] | None) -> None:
        """A newer run (forced): every unit of the older runs is a zombie from now on. With
        `first`, the run's first batch follows in that mode. `in_flight` (job, mode): a batch of
        a job (this one: a zombie) read before the new run and committed after it."""
        flight = self._take_off(in_flight, 0)
        jm = self.jobs[j]
        run = start_run(Store(self.env.engine, self.env.db), jm.name, force=True)
        assert run.generation == jm.generation + 1
        jm.run, jm.generation = run, run.generation
        said = ""
        if first is not None:
            planned, said = self._plan(j, None, skip=True)
            if planned is not None:
                said = self._read_and_commit(planned, first)
            said = f", then {said}"
        self._step(f"new run{said}{self._land(flight)}")

    @rule(
        j=st.integers(0, 1),
        t=st.integers(0, 1),
        part=st.sampled_from([None, 0, 1]),
        kind=st.sampled_from(["earliest", "latest", "offset", "shift"]),
        at=st.integers(0, 12),
        shift=st.integers(-4, 4),
    )
    def reset(self, j: int, t: int, part: int | None, kind: str, at: int, shift: int) -> None:
        """An audited admin reset (apply_reset, forced over the live run), then what a user who
        replays does: delete the job's results of those partitions at or above the new offset."""
        jm, topic = self.jobs[j], self._topic(t)
        inc = topic.current
        parts = list(range(len(inc.logs))) if part is None else [part % len(inc.logs)]
        keys = [(topic.name, p) for p in parts]
        if kind == "shift" and any(k not in jm.rows for k in keys):
            # plan_reset raises a bare KeyError here: see
            # test_a_shift_of_a_partition_without_a_stored_offset_is_a_clear_error
            self._step("reset skipped (a shift without a stored offset)")
            return
        if kind == "earliest":
            targets = dict.fromkeys(keys, 0)
        elif kind == "latest":
            targets = {k: inc.logs[k[1]].end for k in keys}
        elif kind == "offset":
            at = min(at, *(inc.logs[p].end for p in parts))
            targets = dict.fromkeys(keys, at)
        else:
            targets = {k: min(max(jm.rows[k][0] + shift, 0), inc.logs[k[1]].end) for k in keys}
        value = at if kind == "offset" else shift if kind == "shift" else None
        target = ResetTarget(cast(TargetKind, kind), value=value)
        store = Store(self.env.engine, self.env.db)
        plan = plan_reset(
            store, jm.name, target, topic=topic.name, partitions=tuple(parts),
            kafka=self.env.kafka,
        )  # fmt: skip
        assert {(s.topic, s.partition): s.new for s in plan.steps} == targets
        generation = apply_reset(store, plan, reason="model: replay", force=True)
        assert generation == jm.generation + 1
        jm.generation = generation
        r = self.env.results
        with self.env.engine.begin() as conn:
            for key, new in targets.items():
                self._move(jm, key, new, inc.topic_id, "reset")
                conn.execute(
                    sa.delete(r).where(
                        r.c.job == jm.name,
                        r.c.topic == key[0],
                        r.c.topic_id == inc.topic_id,
                        r.c.part == key[1],
                        r.c.off >= new,
                    )
                )
                for k in [k for k in jm.results if k[:3] == (key[0], inc.topic_id, key[1]) and k[3] >= new]:
                    del jm.results[k]
        self._step(f"reset {kind}")

    # -- batches: plan, read, commit -----------------------------------------------------------

    @rule(how=st.tuples(ARRIVE, st.integers(0, 1), CAPS, st.booleans(), MODES))
    def batch(self, how: tuple[str | None, int, int | None, bool, str]) -> None:
        """New records arrive (a transaction, committed or aborted, over the partitions of a
        topic: `arrive`), then a batch of job `j` as a mode runs it: plan (at most `cap` offsets
        per partition, data loss skipped or not), read, commit. The plan stays for stragglers, a
        staged unit for retries. (One argument: Hypothesis tries rules with fewer arguments first,
        and this is the step most worth trying.)"""
        arrive, j, cap, skip, mode = how
        if arrive is not None:
            self._produce(j, [1, 1], commit=arrive == "committed")
        planned, said = self._plan(j, cap, skip=skip)
        if planned is not None:
            said = self._read_and_commit(planned, mode)
        self._step(f"batch: {said}")

    @rule(j=st.integers(0, 1), cap=CAPS, skip=st.booleans())
    def plan(self, j: int, cap: int | None, skip: bool) -> None:
        """A plan only: read and committed by a later step, after others moved on (a straggler)."""
        _, said = self._plan(j, cap, skip=skip)
        self._step(f"plan only: {said}")

    @precondition(lambda self: self.plans)
    @rule(i=st.integers(0, 7), mode=MODES)
    def straggler(self, i: int, mode: str) -> None:
        """An earlier plan (of an older run, or from before other commits moved the offsets) read
        and committed now."""
        self._step(f"straggler: {self._read_and_commit(self.plans[-1 - i % len(self.plans)], mode)}")

    @precondition(lambda self: self.plans)
    @rule(i=st.integers(0, 7), mode=STAGES)
    def stage(self, i: int, mode: str) -> None:
        """An earlier plan read and prepared, its unit committed by a later step (or never)."""
        staged = self._stage(self.plans[-1 - i % len(self.plans)], mode)
        self._step("stage: " + ("done" if staged is not None else "the range is past the new topic's end"))

    @precondition(lambda self: self.staged)
    @rule(i=st.integers(0, 7))
    def commit(self, i: int) -> None:
        """A staged unit committed - again, if it was before (a retried task, a speculative copy)."""
        unit = self.staged[-1 - i % len(self.staged)]
        self._step(f"commit {unit.mode}: {self._commit_staged(unit)}")

    @rule(fresh=st.tuples(st.booleans(), st.booleans()), i=st.integers(0, 7), swap=st.booleans())
    def shared(self, fresh: tuple[bool, bool], i: int, swap: bool) -> None:
        """A unit of each job in one shared round (commit_units): one transaction, or each alone.
        A job's unit is one staged before (committed or not), or (`fresh`, or none) of a new plan."""
        units: list[Staged] = []
        for j in (0, 1):
            mine = [u for u in self.staged if u.j == j]
            unit = None
            if fresh[j] or not mine:
                planned, _ = self._plan(j, None, skip=True)
                unit = (
                    None if planned is None else self._stage(planned, "staged task" if i % 2 else "unit_of")
                )
            if unit is None and mine:  # nothing new to read (or fenced): one staged before
                unit = mine[-1 - i % len(mine)]
            if unit is None:
                self._step("shared: no unit of each job")
                return
            units.append(unit)
        if swap:
            units.reverse()
        with contextlib.ExitStack() as stack:
            checks = [stack.enter_context(self._failure_leaves_nothing(self.jobs[u.j])) for u in units]
            results = commit_units(self.env.engine, self.env.db, [u.unit for u in units])
            said = []
            for u, check, res in zip(units, checks, results, strict=True):
                got: Outcome | TxnOffsetsError
                if isinstance(res, Exception):
                    assert isinstance(res, TxnOffsetsError), repr(res)
                    got = res
                else:
                    got = _one([o.outcome for o in res], "outcomes")
                check(self._apply(self.jobs[u.j], u.run, u.ranges, u.read, got))
                said.append(self._name(got))
        self._step(f"shared: {' + '.join(sorted(said))}")

    # -- the real-time sink --------------------------------------------------------------------

    @rule(
        arrive=ARRIVE,
        j=st.integers(0, 1),
        t=st.integers(0, 1),
        back=st.integers(0, 2),
        gap=st.booleans(),
        close=st.booleans(),
    )
    def sink(self, arrive: str | None, j: int, t: int, back: int, gap: bool, close: bool) -> None:
        """New records arrive (`arrive`), then a RealTimeSink task is fed what Spark's source would
        hand it from the stored offsets (`back` rows before them: a replay; `gap`: one record left
        out), closed now or by a later step."""
        if arrive is not None:
            self._produce(t, [1, 2], commit=arrive == "committed")
        opened, said = self._open_sink(j, t, back=back, gap=gap)
        if opened is not None and close:
            said = self._close_sink(opened)
        self._step(f"sink: {said}")

    @precondition(lambda self: any(not s.closed for s in self.open_sinks))
    @rule(i=st.integers(0, 3))
    def close_sink(self, i: int) -> None:
        """A sink fed by an earlier step closes: its groups commit now, after what others did since."""
        waiting = [s for s in self.open_sinks if not s.closed]
        self._step(f"sink closed later: {self._close_sink(waiting[i % len(waiting)])}")

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def store_matches_the_model(self) -> None:
        """I1 (and I3 between steps): offsets, generations, results and lineage are the model's."""
        if not self.jobs:
            return
        self._expire_sinks()
        env, r = self.env, self.env.results
        t = tables_for(env.db.schema)
        with env.engine.connect() as conn:
            for jm in self.jobs:
                rows = offset_rows.load_rows(conn, env.db, jm.name)
                assert {k: (v.off, v.topic_id) for k, v in rows.items()} == jm.rows
                generation = conn.execute(
                    sa.select(t.jobs.c.generation).where(t.jobs.c.job == jm.name)
                ).scalar_one()
                assert generation == jm.generation
                found = conn.execute(
                    sa.select(r.c.topic, r.c.topic_id, r.c.part, r.c.off, r.c.value).where(r.c.job == jm.name)
                ).all()
                results = {(x.topic, x.topic_id, x.part, x.off): bytes(x.value) for x in found}
                assert results == jm.results, "the results table differs from the model"
                lineage = conn.execute(
                    sa.select(sa.func.count()).select_from(t.commits).where(t.commits.c.job == jm.name)
                ).scalar_one()
                assert lineage == jm.lineage
                for (topic, part), (off, topic_id) in jm.rows.items():
                    log = self._by_name(topic).history[topic_id].logs[part]
                    skips = jm.skipped.get((topic, topic_id, part), [])
                    counted = {
                        o: v
                        for o, v in log.records(0, off).items()
                        if not any(lo <= o < hi for lo, hi in skips)
                    }
                    mine = {k[3]: v for k, v in jm.results.items() if k[:3] == (topic, topic_id, part)}
                    assert mine == counted, f"{topic}[{part}] below {off}: results are not the records"

    @invariant()
    def offsets_move_back_only_by_audited_moves(self) -> None:
        """I2: every audit row is a move the model made; a lower offset has one of them."""
        if not self.jobs:
            return
        env = self.env
        a = tables_for(env.db.schema).audit
        with env.engine.connect() as conn:
            found = conn.execute(
                sa.select(a.c.id, a.c.job, a.c.topic, a.c.part, a.c.old_off, a.c.new_off, a.c.action)
                .where(a.c.id > self.audit_seen, a.c.job.in_([jm.name for jm in self.jobs]))
                .order_by(a.c.id)
            ).all()
            stored = {jm.name: offset_rows.load_offsets(conn, env.db, jm.name) for jm in self.jobs}
        audits = [(x.job, x.topic, x.part, x.old_off, x.new_off, x.action) for x in found]
        assert sorted(audits, key=repr) == sorted(self.audits, key=repr)
        for jm in self.jobs:
            for key, off in stored[jm.name].items():
                before = self.seen_offsets.get((jm.name, key))
                if before is not None and off < before:  # a commit may have moved on since the move
                    assert any(
                        x[:3] == (jm.name, *key) and x[4] <= off and x[5] in BACKWARDS for x in audits
                    ), f"{jm.name} {key}: {before} -> {off} without an audited move"
                self.seen_offsets[(jm.name, key)] = off
        if found:
            self.audit_seen = found[-1].id
        self.audits.clear()

    # -- helpers -------------------------------------------------------------------------------

    def _step(self, what: str) -> None:
        self.env.stats["steps"] += 1
        self.env.kinds[what] += 1
        event(what)
        note(what)

    def _topic(self, t: int) -> TopicModel:
        return self.topics[t % len(self.topics)]

    def _by_name(self, name: str) -> TopicModel:
        return next(t for t in self.topics if t.name == name)

    def _current_ids(self) -> dict[str, str]:
        return {t.name: t.current.topic_id for t in self.topics}

    def _new_producer(self) -> None:
        """A transactional producer that knows the topics as they are now (after a partition was
        added or a topic re-created, a new one: no stale metadata to wait out)."""
        if self.producer is not None:
            self.producer.flush(30)
        producer = Producer(
            {
                "bootstrap.servers": self.env.kafka.bootstrap_servers,
                "transactional.id": f"model-{uuid.uuid4().hex}",
            }
        )
        producer.init_transactions(30)
        self.producer = producer

    def _described(self, name: str, partitions: int, *, other_than: str | None = None) -> TopicInfo:
        """The topic as Kafka describes it once it has `partitions` partitions and a topic id other
        than `other_than` (bounded: 30 s)."""
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(TxnOffsetsError):
                info = metadata.describe_topics(self.env.kafka, [name])[name]
                if len(info.partitions) == partitions and info.topic_id != other_than:
                    return info
            assert time.monotonic() < deadline, f"{name}: not described as expected within 30 s"
            time.sleep(0.05)

    def _max_audit_id(self) -> int:
        a = tables_for(self.env.db.schema).audit
        with self.env.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(a.c.id), 0))).scalar_one())

    def _move(self, jm: JobModel, key: Key, new: int, topic_id: str, action: str) -> None:
        """An audited move of a job's offset (seed, new partition, data-loss skip, reset)."""
        old = jm.rows.get(key)
        self.audits.append((jm.name, key[0], key[1], None if old is None else old[0], new, action))
        skips = jm.skipped.setdefault((key[0], topic_id, key[1]), [])
        if old is not None and old[1] == topic_id:
            if new > old[0]:
                skips.append((old[0], new))
            elif new < old[0]:  # a replay from `new` counts the records above it again
                skips[:] = [(lo, min(hi, new)) for lo, hi in skips if lo < new]
        elif new > 0:  # another incarnation, or no row: nothing below `new` was read
            skips[:] = [(0, new)]
        jm.rows[key] = (new, topic_id)

    def _take_off(self, in_flight: tuple[int, str] | None, t: int) -> Staged | OpenSink | str | None:
        """A batch in flight across another step: job `j`'s unit read now (mode `mode`, of a new
        plan), or a sink of it fed now (from topic `t`); what it came to if it cannot fly."""
        if in_flight is None:
            return None
        j, mode = in_flight
        if mode == "sink":
            opened, said = self._open_sink(j, t, back=0, gap=False)
            return opened if opened is not None else said
        planned, said = self._plan(j, None, skip=True)
        staged = None if planned is None else self._stage(planned, mode)
        return staged if staged is not None else said

    def _land(self, flight: Staged | OpenSink | str | None) -> str:
        """Commit what `_take_off` started; what happened, for the step's name."""
        if flight is None:
            return ""
        if isinstance(flight, str):
            return f" (in flight: {flight})"
        if isinstance(flight, OpenSink):
            return f" (a sink in flight: {self._close_sink(flight)})"
        return f" (a batch in flight: {self._commit_staged(flight)})"

    def _produce(self, t: int, counts: list[int], *, commit: bool) -> None:
        """One transaction: counts[p] records to each partition p (at least one record), its
        marker after them; Kafka's read_committed ends must then be the model's."""
        topic = self._topic(t)
        inc = topic.current
        per_partition = {p: counts[p] for p in range(len(inc.logs)) if counts[p] > 0} or {0: 1}
        producer = self.producer
        assert producer is not None
        producer.begin_transaction()
        for p, n in per_partition.items():
            log = inc.logs[p]
            for off in range(log.end, log.end + n):
                value = f"{inc.topic_id}/{p}/{off}".encode()
                producer.produce(topic.name, key=f"k{off % 3}".encode(), value=value, partition=p)
                if commit:
                    log.committed[off] = value
            log.end += n + 1  # the records, then the transaction's marker
        assert producer.flush(30) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
        ends = settled_ends(self.env.kafka, topic.name, len(inc.logs))
        assert ends == {(topic.name, p): log.end for p, log in enumerate(inc.logs)}

    def _plan(self, j: int, cap: int | None, *, skip: bool) -> tuple[Planned | None, str]:
        """plan_batch for job `j` with its newest run, checked against the model's plan (and its
        moves applied to the model); the plan if it has ranges (kept for later steps), and what
        happened."""
        jm = self.jobs[j]
        predicted = self._predict_plan(jm, cap, skip=skip)
        try:
            plan = plan_batch(
                Store(self.env.engine, self.env.db), self.env.kafka, job=jm.name,
                selection=TopicSelection(tuple(t.name for t in self.topics)),
                start=StartPolicy.earliest(), limits=Limits(max_records_per_partition=cap),
                on_data_loss="skip" if skip else "fail", run=jm.run,
            )  # fmt: skip
        except TxnOffsetsError as exc:
            _is_expected(exc, predicted if isinstance(predicted, type) else None)
            return None, f"plan {type(exc).__name__}"
        assert not isinstance(predicted, type), f"the plan succeeded, the model expected {predicted}"
        moves, ranges = predicted
        for key, new, topic_id, action in moves:
            self._move(jm, key, new, topic_id, action)
        jm.planned = True
        got = [(r, r.topic_id) for r in plan.ranges]
        assert got == [(r, r.topic_id) for r in ranges], (got, ranges)
        if not ranges:
            return None, "nothing to read"
        planned = Planned(j, jm.run, tuple(ranges))
        self.plans.append(planned)
        return planned, "planned"

    def _read_and_commit(self, planned: Planned, mode: str) -> str:
        """Read and commit `planned` in `mode`: a PartitionTask run whole (all its ranges in one
        transaction, or one per range), or staged and committed (kept for retries)."""
        if mode.startswith("task"):
            return self._run_task(planned, 1 if mode == "task per range" else None)
        staged = self._stage(planned, mode)
        if staged is None:
            return "the range is past the new topic's end"
        return self._commit_staged(staged)

    def _run_task(self, planned: Planned, per_transaction: int | None) -> str:
        """A PartitionTask as a Spark task runs it (it stops at the first transaction that fails)."""
        if not self._readable(planned.ranges):
            return "the range is past the new topic's end"
        jm = self.jobs[planned.j]
        task = self._task(planned, per_transaction)
        groups = [planned.ranges] if per_transaction is None else [(r,) for r in planned.ranges]
        said = []
        with self._failure_leaves_nothing(jm) as check:
            reports = list(task(0, [tuple(range(len(planned.ranges)))]))
            seen = 0
            for group in groups:
                mine = reports[seen : seen + len(group)]
                assert [r.range for r in mine] == list(group), (reports, groups)
                seen += len(group)
                got = _reported(mine)
                failed = self._apply(jm, planned.run, group, self._kafka_records(group), got)
                check(failed)
                said.append(self._name(got))
                if failed:
                    break
            assert seen == len(reports), reports
        return f"task ({'per range' if per_transaction else 'one transaction'}) {', '.join(said)}"

    def _stage(self, planned: Planned, mode: str) -> Staged | None:
        """Read and prepare a plan's ranges (PartitionTask.stage, or prepare_range + unit_of); the
        records read must be Kafka's. None when the ranges cannot be read (see _readable)."""
        if not self._readable(planned.ranges):
            return None
        prepared, unit, commit = (self._stage_task if mode == "staged task" else self._stage_unit)(planned)
        read = {p.range.key: dict(p.value) for p in prepared}
        assert read == self._kafka_records(planned.ranges), "the read differs from Kafka's records"
        staged = Staged(planned.j, mode, planned.run, planned.ranges, read, unit, commit)
        self.staged.append(staged)
        return staged

    def _stage_task(self, planned: Planned) -> tuple[list[Prepared[Values]], Unit, Commit]:
        """PartitionTask.stage now, PartitionTask.commit when the unit is committed."""
        task = self._task(planned, None)
        staged = task.stage(list(planned.ranges))
        assert staged.stop is None, staged.stop
        prepared = staged.prepared
        return prepared, task.unit(prepared), lambda: _reported(task.commit(prepared))

    def _stage_unit(self, planned: Planned) -> tuple[list[Prepared[Values]], Unit, Commit]:
        """prepare_range + unit_of (a low-latency follower's unit), committed by commit_unit."""
        prepared: list[Prepared[Values]] = []
        for r in planned.ranges:
            item = prepare_range(
                r, read_range(self.env.kafka, r, stall_timeout_s=20.0), _prepare, dead_letters=False
            )
            assert isinstance(item, Prepared), item
            prepared.append(item)
        write = self._ranges_write(self.jobs[planned.j].name)
        unit = unit_of(planned.run, self.env.db, prepared, write, source=self.env.kafka, batch=None)

        def commit() -> Outcome | TxnOffsetsError:
            try:
                outcomes = commit_unit(self.env.engine, self.env.db, unit)
            except TxnOffsetsError as exc:
                return exc
            return _one([o.outcome for o in outcomes], "outcomes")

        return prepared, unit, commit

    def _commit_staged(self, unit: Staged) -> str:
        jm = self.jobs[unit.j]
        with self._failure_leaves_nothing(jm) as check:
            got = unit.commit()
            check(self._apply(jm, unit.run, unit.ranges, unit.read, got))
        return f"{unit.mode} {self._name(got)}"

    def _open_sink(self, j: int, t: int, *, back: int, gap: bool) -> tuple[OpenSink | None, str]:
        """A RealTimeSink of job `j`'s newest run, opened and fed the rows of topic `t` (see
        _sink_rows); None if process() failed as the model said (the task failed: closed)."""
        jm, topic = self.jobs[j], self._topic(t)
        self.epoch += 1
        sink = RealTimeSink(
            run=jm.run, database=self.env.db, kafka=self.env.kafka, write=self._rows_write(jm.name),
            max_rows=1000, max_delay_s=60,
        )  # fmt: skip
        opened = OpenSink(j, sink, [], time.monotonic())
        self.open_sinks.append(opened)  # closed by the teardown whatever happens here
        sink.open(0, self.epoch)
        with self._failure_leaves_nothing(jm) as check:
            for p, log in enumerate(topic.current.logs):
                feed, group, expected = self._sink_rows(jm, (topic.name, p), back=back, gap=gap)
                try:
                    for off in feed:
                        sink.process(_row(topic.name, p, off, log.committed[off]))
                except TxnOffsetsError as exc:
                    _is_expected(exc, expected)
                    opened.closed = True
                    sink.close(exc)  # Spark fails the task: nothing buffered is committed
                    check(True)
                    return None, type(exc).__name__
                assert expected is None, f"the sink took rows where the model expected {expected.__name__}"
                if group is not None:
                    opened.groups.append(group)
            check(False)
        return opened, "fed, left open"

    def _sink_rows(
        self, jm: JobModel, key: Key, *, back: int, gap: bool
    ) -> tuple[list[int], tuple[OffsetRange, Rows] | None, type[TxnOffsetsError] | None]:
        """The offsets to feed a sink for one partition (up to 4 committed records of the topic as
        it is now, from `back` before the stored offset), the group the sink makes of them, or the
        error process() raises: ConfigError (no offset row), StreamDiverged (a record left out)."""
        log = self._by_name(key[0]).current.logs[key[1]]
        row = jm.rows.get(key)
        base = 0 if row is None else max(0, row[0] - back)
        feed = sorted(o for o in log.committed if o >= base)[:4]
        if row is None:
            return feed, None, ConfigError if feed else None
        kept = [o for o in feed if o >= row[0]]
        if gap and len(kept) >= 2:
            feed.remove(kept.pop(0))
        if not kept:
            return feed, None, None
        if log.records(row[0], kept[0]):  # records between the stored offset and the first row
            return feed, None, StreamDiverged
        rng = OffsetRange(key[0], key[1], row[0], kept[-1] + 1, row[1])
        return feed, (rng, {o: log.committed[o] for o in kept}), None

    def _predict_plan(
        self, jm: JobModel, cap: int | None, *, skip: bool
    ) -> type[TxnOffsetsError] | tuple[list[tuple[Key, int, str, str]], list[OffsetRange]]:
        """plan_batch's answer: Fenced, DataLoss, or its moves (seeds, skips) and ranges."""
        if not jm.live:
            return Fenced
        rows = dict(jm.rows)
        moves: list[tuple[Key, int, str, str]] = []
        ids = self._current_ids()
        partitions = [(t.name, p) for t in self.topics for p in range(len(t.current.logs))]
        known = {topic for topic, _ in rows}
        for key in partitions:
            if key not in rows:
                action = "new_partition" if key[0] in known else "new_topic" if jm.planned else "seed"
                rows[key] = (0, ids[key[0]])
                moves.append((key, 0, ids[key[0]], action))
        for key in partitions:
            off, topic_id = rows[key]
            end = self._by_name(key[0]).current.logs[key[1]].end
            if topic_id != ids[key[0]] or off > end:
                if not skip:
                    return DataLoss
                resume = 0 if topic_id != ids[key[0]] else end
                rows[key] = (resume, ids[key[0]])
                moves.append((key, resume, ids[key[0]], "data_loss_skip"))
        ranges = []
        for key in partitions:
            start = rows[key][0]
            end = self._by_name(key[0]).current.logs[key[1]].end
            until = min(end, start + cap) if cap is not None else end
            if until > start:
                ranges.append(OffsetRange(key[0], key[1], start, until, ids[key[0]]))
        return moves, sorted(ranges)

    def _readable(self, ranges: Sequence[OffsetRange]) -> bool:
        """A range of a topic re-created since its plan is read only where the new log covers it
        (a reader asked for offsets the log does not have yet waits for them until its stall bound)."""
        for r in ranges:
            inc = self._by_name(r.topic).current
            if r.topic_id != inc.topic_id and (
                r.partition >= len(inc.logs) or inc.logs[r.partition].end < r.until
            ):
                return False
        return True

    def _kafka_records(self, ranges: Sequence[OffsetRange]) -> dict[Key, Rows]:
        """What a read_committed reader finds in `ranges` now: the current incarnation's records."""
        return {
            r.key: self._by_name(r.topic).current.logs[r.partition].records(r.start, r.until) for r in ranges
        }

    def _task(self, planned: Planned, per_transaction: int | None) -> PartitionTask[Values]:
        return PartitionTask(
            database=self.env.db, kafka=self.env.kafka, run=planned.run, ranges=planned.ranges,
            prepare=_prepare, write=self._ranges_write(self.jobs[planned.j].name),
            read=dataclasses.replace(READ, ranges_per_transaction=per_transaction),
        )  # fmt: skip

    def _insert(
        self, conn: sa.Connection, job: str, rng: OffsetRange, rows: Sequence[tuple[int, bytes]]
    ) -> None:
        self.env.stats["writes"] += 1
        if rows:
            conn.execute(
                sa.insert(self.env.results),
                [
                    {
                        "job": job,
                        "topic": rng.topic,
                        "topic_id": rng.topic_id,
                        "part": rng.partition,
                        "off": o,
                        "value": v,
                    }
                    for o, v in rows
                ],
            )

    def _ranges_write(self, job: str) -> Callable[[sa.Connection, Sequence[tuple[OffsetRange, Any]]], None]:
        def write(conn: sa.Connection, items: Sequence[tuple[OffsetRange, Any]]) -> None:
            for rng, rows in items:
                self._insert(conn, job, rng, rows)

        return write

    def _rows_write(self, job: str) -> Callable[[sa.Connection, OffsetRange, Sequence[Any]], None]:
        def write(conn: sa.Connection, rng: OffsetRange, rows: Sequence[Any]) -> None:
            self._insert(conn, job, rng, [(int(r["offset"]), bytes(r["value"])) for r in rows])

        return write

    def _apply(
        self,
        jm: JobModel,
        run: Run,
        ranges: Sequence[OffsetRange],
        read: dict[Key, Rows],
        got: Outcome | TxnOffsetsError,
    ) -> bool:
        """Check a commit's answer against the model's and apply it; True if it failed."""
        expected = _predicted(jm, run, ranges, self._current_ids())
        if isinstance(expected, Outcome):
            assert got is expected, f"{ranges}: got {got!r}, the model expected {expected}"
            if expected is Outcome.COMMITTED:
                for r in ranges:
                    jm.rows[r.key] = (r.until, str(r.topic_id))
                    for off, value in read[r.key].items():
                        jm.results[(r.topic, str(r.topic_id), r.partition, off)] = value
                jm.lineage += len(ranges)
            return False
        assert isinstance(got, TxnOffsetsError), (
            f"{ranges}: got {got!r}, the model expected {expected.__name__}"
        )
        assert type(got) is expected, f"{ranges}: got {got!r}, the model expected {expected.__name__}"
        return True

    @contextlib.contextmanager
    def _failure_leaves_nothing(self, jm: JobModel) -> Iterator[Callable[[bool], None]]:
        """I3: around one or more transactions of a job, ``check(failed)`` says how each ended.
        When the first one failed, the job's offsets, results and lineage must be exactly as
        before (after an earlier one committed, the invariant compares the store with the model)."""
        before = self._snapshot(jm)
        ends: list[bool] = []
        yield ends.append
        if ends[:1] == [True]:
            assert self._snapshot(jm) == before, "a failed commit changed the store"
            self.env.stats["failed commits"] += 1

    def _snapshot(self, jm: JobModel) -> tuple[Any, ...]:
        env, r = self.env, self.env.results
        t = tables_for(env.db.schema)
        with env.engine.connect() as conn:
            offsets = offset_rows.load_offsets(conn, env.db, jm.name)
            results = conn.execute(
                sa.select(sa.func.count()).select_from(r).where(r.c.job == jm.name)
            ).scalar_one()
            lineage = conn.execute(
                sa.select(sa.func.count()).select_from(t.commits).where(t.commits.c.job == jm.name)
            ).scalar_one()
        return offsets, results, lineage

    def _close_sink(self, opened: OpenSink) -> str:
        """Close a sink: it commits its groups in order and stops at the first that fails."""
        jm = self.jobs[opened.j]
        opened.closed = True
        expected: type[TxnOffsetsError] | None = None
        committed = 0
        with self._failure_leaves_nothing(jm) as check:
            for rng, rows in opened.groups:  # what the model says each group comes to, in order
                want = _predicted(jm, opened.sink.run, [rng], self._current_ids())
                if not isinstance(want, Outcome):
                    expected = want
                    break
                assert not self._apply(jm, opened.sink.run, [rng], {rng.key: rows}, want)
                committed += 1
            try:
                opened.sink.close(None)
            except TxnOffsetsError as exc:
                _is_expected(exc, expected)
                check(committed == 0)
                return f"{committed} group(s) committed, then {type(exc).__name__}"
            check(False)
        assert expected is None, f"the sink committed where the model expected {expected.__name__}"
        return f"{committed} group(s) committed"

    def _expire_sinks(self) -> None:
        """Close sinks open for SINK_MAX_AGE_S as failed (nothing of them committed): their flusher
        would commit on its own at 60 s, at a moment no step chose."""
        now = time.monotonic()
        for opened in self.open_sinks:
            if not opened.closed and now - opened.opened_at > SINK_MAX_AGE_S:
                opened.closed = True
                opened.sink.close(RuntimeError("open too long"))

    @staticmethod
    def _name(got: Outcome | TxnOffsetsError) -> str:
        return got.value if isinstance(got, Outcome) else type(got).__name__


def _prepare(records: Iterator[Record], dead: Any) -> Values:
    return [(r.offset, bytes(r.value or b"")) for r in records]


def _row(topic: str, partition: int, offset: int, value: bytes) -> dict[str, Any]:
    """A row as Spark's Kafka source hands it to a foreach writer."""
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": f"k{offset % 3}".encode(),
        "value": value,
    }


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.fixture
def model_env(
    database_url: str, pg_schema: str, kafka_bootstrap: str, kafka_admin: AdminClient
) -> Iterator[Callable[[int], Env]]:
    db = DatabaseSettings(database_url, schema=pg_schema)
    migrate.upgrade(db)
    engine = engine_for(db)
    results = sa.Table(
        "results",
        sa.MetaData(schema=pg_schema),
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("topic_id", sa.Text, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("off", sa.BigInteger, primary_key=True),
        sa.Column("value", sa.LargeBinary, nullable=False),
    )
    with engine.begin() as conn:
        results.create(conn)
    kafka = KafkaSettings(kafka_bootstrap)
    try:
        yield lambda recreations: Env(engine, db, kafka, kafka_admin, results, recreations)
    finally:
        engine.dispose()
        worker_engine(db).dispose()


def _run_model(request: pytest.FixtureRequest, env: Env, profile: dict[str, int], name: str) -> None:
    started = time.monotonic()
    try:

        class Bound(CommitModel):
            def __init__(self) -> None:
                super().__init__(env)

        run_state_machine_as_test(
            Bound,
            settings=settings(
                max_examples=profile["max_examples"],
                stateful_step_count=profile["stateful_step_count"],
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        took = time.monotonic() - started
        line = (
            f"commit model ({name}): {env.stats['examples']} examples, {env.stats['steps']} steps, "
            f"{env.stats['failed commits']} failed commits checked, {took:.1f} s"
        )
        if os.environ.get("TXN_OFFSETS_MODEL_VERBOSE"):
            line += "".join(f"\n  {n:4d} x {what}" for what, n in sorted(env.kinds.items()))
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                reporter.write_line(line)
        request.node.user_properties.append(("model_steps", env.stats["steps"]))
    assert env.stats["steps"] >= profile["max_examples"]  # the machine ran, not just set up


def test_commit_model(request: pytest.FixtureRequest, model_env: Callable[[int], Env]) -> None:
    """The short profile (make test)."""
    _run_model(request, model_env(SHORT["recreations"]), SHORT, "short")


@pytest.mark.slow
def test_commit_model_long(request: pytest.FixtureRequest, model_env: Callable[[int], Env]) -> None:
    """The long profile (make chaos): more examples, longer ones, more re-created topics."""
    _run_model(request, model_env(LONG["recreations"]), LONG, "long")


# ---------------------------------------------------------------------------------------------
# plain regression tests of what the model found


def test_a_shift_of_a_partition_without_a_stored_offset_is_a_clear_error(
    database_url: str, pg_schema: str, kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """``offsets reset --shift-by N --topic T`` for a job with no stored offset for a partition of T
    (a job that never planned T, or a partition added since) must be a clear error that names the
    partition and changes nothing (I4). Found by the model: plan_reset raised a bare KeyError."""
    db = DatabaseSettings(database_url, schema=pg_schema)
    migrate.upgrade(db)
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    engine = engine_for(db)
    try:
        run = start_run(Store(engine, db), f"job-{uuid.uuid4().hex[:10]}")
        with pytest.raises(ConfigError, match=rf"{topic}\[0\]"):
            plan_reset(Store(engine, db), run.job, ResetTarget("shift", -1), topic=topic, kafka=kafka)
        with engine.connect() as conn:
            assert offset_rows.load_offsets(conn, db, run.job) == {}
    finally:
        engine.dispose()
