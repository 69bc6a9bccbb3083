"""What must hold after every run, checked against Kafka and the tables themselves.

The oracle is recomputed from what Kafka holds (``read_committed``: committed records only),
read with a plain confluent-kafka consumer, independently of the library's reader. Checks:

* I1 results: the per-user counts equal the oracle over exactly the offsets below the stored
  offsets (after a crash too: a committed range is whole, an uncommitted one left nothing).
  Once a scenario has caught up, the differences are reported as ``lost`` and ``duplicated``.
* I2 offsets: stored == end offsets at the end; the offset history (a trigger on the offsets
  table, in the harness's own schema) never moves backwards except by an audited reset (or an
  audited ``data_loss_skip`` to the start of a topic the harness deleted and re-created), and
  every move is either one applied range or an audited admin action.
* I3 no partial results: the applied ranges of a partition, in the order they were applied,
  chain without gap or overlap from the seed to the stored offset (audited skips and resets
  bridge the gaps they made), and their record counts match the oracle.

A topic that was deleted and re-created under the same name (F12) has several incarnations: the
earlier ones are passed as ``earlier`` logs, and a backwards ``data_loss_skip`` is the step from
one incarnation to the next.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from chaos.faults import tables
from txn_offsets.config import validate_identifier

__all__ = ["Check", "KafkaLog", "check_run", "install_history", "read_log"]

logger = logging.getLogger(__name__)

TP = tuple[str, int]


@dataclass
class KafkaLog:
    """The committed records of some partitions: offsets and interned keys, compactly."""

    offsets: dict[TP, array[int]] = field(default_factory=dict)
    keys: dict[TP, array[int]] = field(default_factory=dict)
    ends: dict[TP, int] = field(default_factory=dict)
    starts: dict[TP, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(len(v) for v in self.offsets.values())

    def expected(
        self,
        upto: Mapping[TP, int],
        *,
        excluded: Mapping[TP, list[tuple[int, int]]] | None = None,
    ) -> collections.Counter[tuple[str, str]]:
        """(topic, user) -> count of the records below `upto` (minus `excluded` offset ranges)."""
        out: collections.Counter[tuple[str, str]] = collections.Counter()
        for tp, offs in self.offsets.items():
            cut = bisect.bisect_left(offs, upto.get(tp, 0))
            counted = collections.Counter(self.keys[tp][:cut])
            for lo, hi in (excluded or {}).get(tp, []):
                a, b = bisect.bisect_left(offs, lo), bisect.bisect_left(offs, min(hi, upto.get(tp, 0)))
                counted.subtract(self.keys[tp][a:b])
            for key_id, n in counted.items():
                if n:
                    out[(tp[0], self.names[key_id])] += n
        return out

    def count_between(self, tp: TP, lo: int, hi: int) -> int:
        offs = self.offsets.get(tp, array("q"))
        return bisect.bisect_left(offs, hi) - bisect.bisect_left(offs, lo)


def read_log(bootstrap: str, topics: Mapping[str, int], *, timeout_s: float = 300.0) -> KafkaLog:
    """Read every committed record of `topics` ({topic: partitions}) from the log start to the LSO."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-oracle",  # never committed: assign() + enable.auto.commit=false
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
        }
    )
    log = KafkaLog()
    index: dict[str, int] = {}
    try:
        todo: set[TP] = set()
        assignment = []
        marks = _settled_watermarks(consumer, bootstrap, topics)
        for topic, parts in topics.items():
            for p in range(parts):
                tp = (topic, p)
                lo, hi = marks[tp]
                log.starts[tp], log.ends[tp] = lo, hi
                log.offsets[tp], log.keys[tp] = array("q"), array("i")
                if hi > lo:
                    todo.add(tp)
                    assignment.append(TopicPartition(topic, p, lo))
        if assignment:
            consumer.assign(assignment)
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the oracle could not read {sorted(todo)} to their end")
            for msg in consumer.consume(10_000, timeout=1.0):
                tp = (str(msg.topic()), int(msg.partition() or 0))
                err = msg.error()
                if err is not None:
                    if err.code() == -191:  # _PARTITION_EOF
                        _done_if_at_end(consumer, tp, log, todo)
                        continue
                    raise RuntimeError(f"oracle read of {tp}: {err}")
                offset = int(msg.offset() or 0)
                if offset >= log.ends[tp]:
                    continue
                key = (msg.key() or b"").decode(errors="replace")
                key_id = index.get(key)
                if key_id is None:
                    key_id = index[key] = len(log.names)
                    log.names.append(key)
                log.offsets[tp].append(offset)
                log.keys[tp].append(key_id)
            for tp in list(todo):
                _done_if_at_end(consumer, tp, log, todo)
    finally:
        consumer.close()
    return log


def _settled_watermarks(
    consumer: Consumer, bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0
) -> dict[TP, tuple[int, int]]:
    """(log start, LSO) per partition, once no transaction is open: COMMIT returns to the producer
    before the coordinator has written the commit markers, so right after a producer finished the
    LSO can still sit at the start of its last transaction. Waits (bounded) until the LSO equals
    the high watermark of a read_uncommitted consumer, i.e. every transaction has its marker."""
    # librdkafka's default isolation.level is read_committed: the high watermark needs read_uncommitted
    plain = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-oracle",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    tps = [TopicPartition(topic, p) for topic, parts in topics.items() for p in range(parts)]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            marks = {
                (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30, cached=False)
                for tp in tps
            }
            open_txn = [
                key
                for key, tp in zip(marks, tps, strict=True)
                if plain.get_watermark_offsets(tp, timeout=30, cached=False)[1] != marks[key][1]
            ]
            if not open_txn or time.monotonic() > deadline:
                if open_txn:
                    logger.warning(
                        "chaos oracle: %s still have an open transaction; reading to the LSO", open_txn
                    )
                return marks
            time.sleep(0.1)
    finally:
        plain.close()


def _done_if_at_end(consumer: Consumer, tp: TP, log: KafkaLog, todo: set[TP]) -> None:
    (pos,) = consumer.position([TopicPartition(tp[0], tp[1])])
    if pos.offset >= log.ends[tp]:
        todo.discard(tp)


def install_history(conn: sa.Connection, schema: str) -> None:
    """A trigger on the offsets table that logs every change of a row to chaos_offset_history."""
    s = '"' + validate_identifier(schema, "schema") + '"'  # validated: safe to render as identifier
    conn.execute(
        sa.text(
            f"CREATE TABLE {s}.chaos_offset_history (id bigserial PRIMARY KEY, job text, topic text, "
            "part int, old_off bigint, new_off bigint, op text, at timestamptz DEFAULT clock_timestamp())"
        )
    )
    conn.execute(
        sa.text(
            f"CREATE FUNCTION {s}.chaos_history() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {s}.chaos_offset_history(job, topic, part, old_off, new_off, op) VALUES ("
            "COALESCE(NEW.job, OLD.job), COALESCE(NEW.topic, OLD.topic), COALESCE(NEW.part, OLD.part), "
            "CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.off END, "
            "CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.off END, TG_OP); RETURN NULL; END $$"
        )
    )
    conn.execute(
        sa.text(
            f"CREATE TRIGGER chaos_history AFTER INSERT OR UPDATE OR DELETE ON {s}.offsets "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.chaos_history()"
        )
    )
    # F3: COMMIT runs deferred constraint triggers; this one sleeps, so a COMMIT stays in flight
    # long enough for pg_terminate_backend to hit it
    conn.execute(
        sa.text(
            f"CREATE FUNCTION {s}.chaos_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_sleep(0.25); RETURN NULL; END $$"
        )
    )
    conn.execute(
        sa.text(
            f"CREATE CONSTRAINT TRIGGER chaos_slow_commit AFTER INSERT ON {s}.chaos_commit_probe "
            f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.chaos_slow_commit()"
        )
    )


@dataclass
class Check:
    """The outcome of one invariant check."""

    lost: int = 0
    duplicated: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and self.lost == 0 and self.duplicated == 0


def check_run(
    engine: sa.Engine,
    *,
    schema: str,
    job: str,
    log: KafkaLog,
    final: bool,
    excluded: Mapping[TP, list[tuple[int, int]]] | None = None,
    earlier: Sequence[KafkaLog] = (),
) -> Check:
    """Check I1-I3 for `job` now. `final`: the job should have caught up with `log.ends`.

    `excluded`: offset ranges of `log` deleted before they were processed (F7). `earlier`: the
    logs of earlier incarnations of re-created topics, oldest first (F12); the job had caught up
    with each before it was deleted, so each counts in full."""
    check = Check()
    t = tables(schema)
    stored, audits, history, applied = _load(engine, schema, job)
    # F19: jobs sharing the schema, each on topics of its own: the others' results are theirs
    foreign = _others_topics(engine, schema, job)
    applied = [a for a in applied if a[0] not in foreign]
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(t.counts.c.topic, t.counts.c.k, t.counts.c.n)):
            if row.topic not in foreign:
                counts[(row.topic, row.k)] = int(row.n)
    expected = log.expected(stored, excluded=excluded)
    for old_log in earlier:
        expected += old_log.expected(old_log.ends)
    for key in set(counts) | set(expected):
        diff = counts[key] - expected[key]
        if diff > 0:
            check.duplicated += diff
        elif diff < 0:
            check.lost -= diff
    if check.lost or check.duplicated:
        check.violations.append(
            f"I1 results != oracle below the stored offsets: lost={check.lost} duplicated={check.duplicated}"
        )
    if final:
        behind = {tp: (stored.get(tp), end) for tp, end in log.ends.items() if stored.get(tp) != end}
        if behind:
            check.violations.append(f"I2 stored offsets != end offsets: {dict(sorted(behind.items()))}")
    recreated = {tp for old_log in earlier for tp in old_log.offsets}
    check.violations.extend(_history_violations(history, audits, applied, recreated))
    incarnations = {tp: [*(e for e in earlier if tp in e.offsets), log] for tp in stored}
    chain = _chain_violations(stored, audits, applied, incarnations, excluded or {}, final=final)
    check.violations.extend(chain)
    check.violations.extend(_lineage_violations(engine, schema, job, applied))
    return check


def _others_topics(engine: sa.Engine, schema: str, job: str) -> set[str]:
    """The topics only OTHER jobs of `schema` have offsets of (none when the job is alone there:
    then every result row in the schema is this job's to account for)."""
    s = '"' + validate_identifier(schema, "schema") + '"'
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT DISTINCT topic FROM {s}.offsets WHERE job <> :j "
                f"EXCEPT SELECT DISTINCT topic FROM {s}.offsets WHERE job = :j"
            ),
            {"j": job},
        )
        return {r.topic for r in rows}


def _lineage_violations(
    engine: sa.Engine, schema: str, job: str, applied: list[tuple[str, int, int, int, int]]
) -> list[str]:
    """The job's lineage (``commits``) holds each applied range exactly as often as it was applied
    (once, unless an audited reset made it run again): no row for a rolled-back attempt, none
    missing for a commit. The applied ranges chain (I3), so the lineage chains too."""
    s = '"' + validate_identifier(schema, "schema") + '"'
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT topic, part, from_off, until_off FROM {s}.commits WHERE job = :j"), {"j": job}
        )
        recorded = collections.Counter((r.topic, r.part, int(r.from_off), int(r.until_off)) for r in rows)
    ran = collections.Counter((t, p, a, b) for t, p, a, b, _ in applied)
    out = [
        f"L1 lineage of {t}[{p}] range [{a}, {b}): {recorded[k]} commits row(s), applied {ran[k]} time(s)"
        for k in sorted(set(recorded) | set(ran))
        if recorded[k] != ran[k]
        for t, p, a, b in [k]
    ]
    return out[:20]


Row = tuple[str, int, int | None, int | None, str]


def _load(
    engine: sa.Engine, schema: str, job: str
) -> tuple[dict[TP, int], list[Row], list[Row], list[tuple[str, int, int, int, int]]]:
    s = '"' + validate_identifier(schema, "schema") + '"'
    with engine.connect() as conn:
        stored = {
            (r.topic, r.part): int(r.off)
            for r in conn.execute(
                sa.text(f"SELECT topic, part, off FROM {s}.offsets WHERE job = :j"), {"j": job}
            )
        }
        audits: list[Row] = [
            (r.topic, r.part, r.old_off, r.new_off, r.action)
            for r in conn.execute(
                sa.text(
                    f"SELECT topic, part, old_off, new_off, action FROM {s}.offset_audit WHERE job = :j "
                    "ORDER BY id"
                ),
                {"j": job},
            )
        ]
        history: list[Row] = [
            (r.topic, r.part, r.old_off, r.new_off, r.op)
            for r in conn.execute(
                sa.text(
                    f"SELECT topic, part, old_off, new_off, op FROM {s}.chaos_offset_history WHERE job = :j "
                    "ORDER BY id"
                ),
                {"j": job},
            )
        ]
        applied = [
            (r.topic, r.part, int(r.start_off), int(r.until_off), int(r.records))
            for r in conn.execute(
                sa.text(
                    f"SELECT topic, part, start_off, until_off, records FROM {s}.chaos_applied ORDER BY id"
                )
            )
        ]
    return stored, audits, history, applied


def _history_violations(
    history: Iterable[Row],
    audits: list[Row],
    applied: list[tuple[str, int, int, int, int]],
    recreated: Set[TP],
) -> list[str]:
    out: list[str] = []
    ranges: collections.Counter[tuple[str, int, int | None, int | None]] = collections.Counter(
        (t, p, a, b) for t, p, a, b, _ in applied
    )
    admin = collections.Counter((t, p, o, n) for t, p, o, n, action in audits)
    # backwards is allowed for an audited reset, and for the audited skip to the start of a topic
    # that was deleted and re-created (its new incarnation starts again at a low offset)
    resets = {
        (t, p, o, n)
        for t, p, o, n, action in audits
        if action == "reset" or (action == "data_loss_skip" and (t, p) in recreated)
    }
    for topic, part, old, new, op in history:
        key = (topic, part, old, new)
        if op == "UPDATE" and old == new:
            continue  # another column of the row changed (e.g. its topic id): not a move
        if op == "DELETE":
            out.append(f"I2 offset row {topic}[{part}] deleted (at {old})")
        elif op == "INSERT":
            if admin[key] <= 0:
                out.append(f"I2 offset row {topic}[{part}] created at {new} without an audit row")
            admin[key] -= 1
        elif old is not None and new is not None and new < old and key not in resets:
            out.append(
                f"I2 offset of {topic}[{part}] moved backwards {old} -> {new} without an audited reset"
            )
        elif ranges[key] > 0:
            ranges[key] -= 1
        elif admin[key] > 0:
            admin[key] -= 1
        else:
            out.append(
                f"I2 offset of {topic}[{part}] moved {old} -> {new}: neither an applied range nor audited"
            )
    return out[:20]


def _chain_violations(
    stored: Mapping[TP, int],
    audits: list[Row],
    applied: list[tuple[str, int, int, int, int]],
    incarnations: Mapping[TP, list[KafkaLog]],
    excluded: Mapping[TP, list[tuple[int, int]]],
    *,
    final: bool,
) -> list[str]:
    """Per partition, the applied ranges (in the order they were applied) and the audited moves
    must form one chain seed -> stored. Each range of a partition is inserted after its claim,
    which waits for the previous range's commit, so id order is chain order; a backwards
    ``data_loss_skip`` moves on to the partition's next incarnation (`incarnations`, oldest first)."""
    out: list[str] = []
    ranges: dict[TP, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for topic, part, a, b, records in applied:
        ranges[(topic, part)].append((a, b, records))
    moves: dict[TP, list[tuple[int, int, str]]] = collections.defaultdict(list)
    for topic, part, old, new, action in audits:
        if action in ("data_loss_skip", "reset") and old is not None and new is not None:
            moves[(topic, part)].append((old, new, action))
    seeds: dict[TP, int] = {(t, p): n for t, p, o, n, _ in audits if o is None and n is not None}
    for tp, off in stored.items():
        name = f"{tp[0]}[{tp[1]}]"
        if tp not in seeds:
            out.append(f"I3 {name} has an offset row but no audited seed")
            continue
        logs = incarnations.get(tp, [])
        walk = _Walk(seeds[tp], moves.get(tp, []), len(logs))
        for a, b, applied_records in ranges.get(tp, []):
            walk.bridge(a)
            if walk.position != a:
                out.append(f"I3 {name}: applied range [{a}, {b}) does not follow {walk.position}")
                break
            if walk.incarnation < len(logs):
                log = logs[walk.incarnation]
                gone = excluded.get(tp, []) if walk.incarnation == len(logs) - 1 else []
                want = log.count_between(tp, a, b) - sum(
                    log.count_between(tp, max(a, lo), min(b, hi))
                    for lo, hi in gone
                    if min(b, hi) > max(a, lo)
                )
                if want != applied_records:
                    out.append(f"I3 {name} range [{a}, {b}) applied {applied_records}, Kafka has {want}")
            walk.position = b
        else:
            walk.bridge(off)
            if walk.position != off:
                out.append(f"I3 {name}: the applied ranges end at {walk.position}, stored is {off}")
            elif walk.moves:
                out.append(f"I3 {name}: audited moves {walk.moves} are not part of its offset chain")
        out.extend(f"I3 {name}: {problem}" for problem in walk.problems)
        if final and walk.incarnation < len(logs) - 1:
            out.append(
                f"I3 {name}: the stored offset {off} is not in the topic's current incarnation "
                f"(incarnation {walk.incarnation + 1} of {len(logs)}): no audited skip to its start"
            )
    return out[:20]


@dataclass
class _Walk:
    """A walk along one partition's offset chain: where it is, and in which incarnation."""

    position: int
    moves: list[tuple[int, int, str]]  # audited moves not walked yet, in audit order
    incarnations: int
    incarnation: int = 0
    problems: list[str] = field(default_factory=list)

    def bridge(self, target: int) -> None:
        """Follow audited moves from the current position towards `target` (no-op if there)."""
        while self.position != target:
            here = [m for m in self.moves if m[0] == self.position]
            if not here:
                return
            step = next((m for m in here if m[1] == target), here[0])
            self.moves.remove(step)
            old, new, action = step
            if action == "data_loss_skip" and new < old:
                self.incarnation += 1
                if self.incarnation >= self.incarnations:
                    self.problems.append(
                        f"data_loss_skip {old} -> {new} moved backwards, but the topic was not re-created"
                    )
            self.position = new
