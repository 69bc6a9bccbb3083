"""What must hold after every run, checked against Kafka and the tables themselves.

The oracle is recomputed from what Kafka holds (``read_committed``: committed records only),
read with a plain confluent-kafka consumer, independently of the library's reader. Checks:

* I1 results: the per-user counts equal the oracle over exactly the offsets below the stored
  offsets (after a crash too: a committed range is whole, an uncommitted one left nothing).
  Once a scenario has caught up, the differences are reported as ``lost`` and ``duplicated``.
* I2 offsets: stored == end offsets at the end; the offset history (a trigger on the offsets
  table, in the harness's own schema) never moves backwards except by an audited reset, and
  every move is either one applied range or an audited admin action.
* I3 no partial results: the applied ranges of a partition chain without gap or overlap from
  the seed to the stored offset, and their record counts match the oracle.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from array import array
from collections.abc import Iterable, Mapping
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
        for topic, parts in topics.items():
            for p in range(parts):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
                tp = (topic, p)
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
) -> Check:
    """Check I1-I3 for `job` now. `final`: the job should have caught up with `log.ends`."""
    check = Check()
    t = tables(schema)
    stored, audits, history, applied = _load(engine, schema, job)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(t.counts.c.topic, t.counts.c.k, t.counts.c.n)):
            counts[(row.topic, row.k)] = int(row.n)
    expected = log.expected(stored, excluded=excluded)
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
    check.violations.extend(_history_violations(history, audits, applied))
    check.violations.extend(_chain_violations(stored, audits, applied, log, excluded or {}))
    return check


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
    history: Iterable[Row], audits: list[Row], applied: list[tuple[str, int, int, int, int]]
) -> list[str]:
    out: list[str] = []
    ranges: collections.Counter[tuple[str, int, int | None, int | None]] = collections.Counter(
        (t, p, a, b) for t, p, a, b, _ in applied
    )
    admin = collections.Counter((t, p, o, n) for t, p, o, n, action in audits)
    resets = {(t, p, o, n) for t, p, o, n, action in audits if action == "reset"}
    for topic, part, old, new, op in history:
        key = (topic, part, old, new)
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
    log: KafkaLog,
    excluded: Mapping[TP, list[tuple[int, int]]],
) -> list[str]:
    """Per partition, the applied ranges and audited moves must form one chain seed -> stored."""
    out: list[str] = []
    steps: dict[TP, list[tuple[int, int, int | None]]] = collections.defaultdict(list)
    for topic, part, a, b, records in applied:
        steps[(topic, part)].append((a, b, records))
    for topic, part, old, new, action in audits:
        if action in ("data_loss_skip", "reset") and old is not None and new is not None:
            steps[(topic, part)].append((old, new, None))
    seeds: dict[TP, int] = {(t, p): n for t, p, o, n, _ in audits if o is None and n is not None}
    for tp, off in stored.items():
        if tp not in seeds:
            out.append(f"I3 {tp[0]}[{tp[1]}] has an offset row but no audited seed")
            continue
        position: int = seeds[tp]
        chain = sorted(steps.get(tp, []), key=lambda s: (s[0], s[1]))
        for a, b, applied_records in chain:
            if a != position:
                out.append(f"I3 {tp[0]}[{tp[1]}]: applied range [{a}, {b}) does not follow {position}")
                break
            if applied_records is not None and tp in log.offsets:
                want = log.count_between(tp, a, b) - sum(
                    max(0, min(b, hi) - max(a, lo)) and log.count_between(tp, max(a, lo), min(b, hi))
                    for lo, hi in excluded.get(tp, [])
                )
                if want != applied_records:
                    out.append(
                        f"I3 {tp[0]}[{tp[1]}] range [{a}, {b}) applied {applied_records}, Kafka has {want}"
                    )
            position = b
        else:
            if position != off:
                out.append(f"I3 {tp[0]}[{tp[1]}]: the applied ranges end at {position}, stored is {off}")
    return out[:20]
