"""The set-based snapshot read (service/snapshot.py) answers exactly what the row-by-row read before
it did (benchmarks/snapshot_before.py, the code as it was), on the same store state: jobs with
several topics, a retired job, partitions Kafka has that are not stored, offsets below the log
start and past the end, a topic Kafka refuses, a topic Kafka does not know, record timestamps, and
offsets that moved after Kafka's facts were fetched. Times (ages) are read twice, so they are
compared within a second."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Collection, Mapping

import sqlalchemy as sa

from benchmarks.snapshot_before import read_snapshot_before
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import TopicPartition
from txn_offsets.service.kafka_view import KafkaFacts, KafkaView
from txn_offsets.service.snapshot import JobView, read_snapshot
from txn_offsets.store.handle import Store

PARTS = 6  # Kafka's partitions of every topic it knows; jobs store some of them


class FixedKafka(KafkaView):
    """Kafka's facts as the test sets them, fetched a minute ago (so offsets moved since are
    proven ends: _proven_marks)."""

    def __init__(self, kafka: KafkaSettings, tag: str) -> None:
        super().__init__(kafka, ttl_s=0)
        self.tag = tag

    def facts(self, stored: Mapping[TopicPartition, Collection[int]]) -> KafkaFacts:
        topics = frozenset(t for t, _ in stored)
        known = {t for t in topics if not t.endswith("-unknown")}
        parts = {t: tuple(range(PARTS)) for t in known if not t.endswith("-refused")}
        marks = {(t, p): (10 * p, 100 + p) for t in parts for p in range(PARTS)}
        stamps: dict[tuple[str, int, int], int | None] = {}
        for (t, p), offsets in stored.items():
            for off in offsets:
                stamps[(t, p, max(off, 10 * p))] = None if p == 2 else 1_700_000_000_000 + p
        for t in parts:
            for p in range(PARTS):
                stamps.setdefault((t, p, 10 * p), 1_600_000_000_000)
        errors = dict.fromkeys(topics - known, "no such topic")
        errors.update({t: "refused: no leader" for t in known if t.endswith("-refused")})
        return KafkaFacts(
            topics, parts, marks, stamps, frozenset(topics - known), None, time.time() - 60.0, errors
        )


def _seed(engine: sa.Engine, db: DatabaseSettings, tag: str) -> list[str]:
    s = f'"{db.schema}"'
    jobs = [f"same-{tag}-{i}" for i in range(4)]
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {s}.jobs (job, generation, run_id, run_host, lease_s, started_at, "
                "heartbeat_at, lease_until) VALUES "
                "(:a, 3, 'run-a', 'h', 60, now(), now() - interval '5 s', now() + interval '1 hour'), "
                "(:b, 1, NULL, NULL, NULL, NULL, NULL, NULL), "
                "(:c, 2, 'run-c', 'h', 60, now(), now() - interval '2 hours', now() - interval '1 hour'), "
                "(:d, 5, NULL, NULL, NULL, now() - interval '2 days', NULL, NULL)"
            ),
            dict(zip("abcd", jobs, strict=True)),
        )
        conn.execute(
            sa.text(f"UPDATE {s}.jobs SET retired_at = now() - interval '1 day' WHERE job = :d"),
            {"d": jobs[3]},
        )
        rows = [
            # job a: two topics, some partitions stored, one below the log start, one past the end
            (jobs[0], f"t-{tag}", 0, 0, "3 hours"),
            (jobs[0], f"t-{tag}", 1, 5, "10 s"),  # below log start 10
            (jobs[0], f"t-{tag}", 2, 50, "1 s"),  # moved after the facts: a proven end? no, < end
            (jobs[0], f"t-{tag}", 3, 130, "1 s"),  # past the end, moved after the facts: end raised
            (jobs[0], f"u-{tag}", 4, 104, "0 s"),  # caught up
            (jobs[0], f"u-{tag}", 5, 300, "2 hours"),  # past the end, moved before the facts
            # job b: a refused topic and an unknown one, and one Kafka knows
            (jobs[1], f"r-{tag}-refused", 0, 7, "1 minute"),
            (jobs[1], f"x-{tag}-unknown", 1, 8, "1 minute"),
            (jobs[1], f"t-{tag}", 5, 60, "30 s"),
            # job c: its lease ran out
            (jobs[2], f"u-{tag}", 0, 1, "4 hours"),
            # job d: retired; its rows give nothing
            (jobs[3], f"t-{tag}", 0, 2, "3 days"),
        ]
        for job, topic, part, off, ago in rows:
            conn.execute(
                sa.text(
                    f"INSERT INTO {s}.offsets (job, topic, part, off, updated_at) "
                    "VALUES (:job, :topic, :part, :off, now() - CAST(:ago AS interval))"
                ),
                {"job": job, "topic": topic, "part": part, "off": off, "ago": ago},
            )
    return jobs


def _close(a: float | None, b: float | None, slack: float = 1.0) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, abs_tol=slack)


def _same(new: JobView, old: JobView) -> None:
    assert (new.job, new.generation, new.run_id, new.live, new.stats) == (
        old.job, old.generation, old.run_id, old.live, old.stats,
    )  # fmt: skip
    assert _close(new.heartbeat_age_s, old.heartbeat_age_s)
    assert dict(new.topic_errors) == dict(old.topic_errors)
    assert new.stored.keys() == old.stored.keys()
    for key, row in new.stored.items():
        assert row.offset == old.stored[key].offset and _close(
            row.last_commit_age_s, old.stored[key].last_commit_age_s
        )
    assert len(new.partitions) == len(old.partitions)
    for n, o in zip(new.partitions, old.partitions, strict=True):
        assert (n.topic, n.partition, n.offset, n.log_start, n.end) == (
            o.topic,
            o.partition,
            o.offset,
            o.log_start,
            o.end,
        )
        assert _close(n.lag_seconds, o.lag_seconds)
    assert new.total_lag == old.total_lag and new.topics == old.topics


def test_the_same_answer_as_before(
    engine: sa.Engine, migrated: DatabaseSettings, kafka_bootstrap: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    jobs = _seed(engine, migrated, tag)
    store, kafka = Store(engine, migrated), FixedKafka(KafkaSettings(kafka_bootstrap), tag)
    for _ in range(2):  # the new first, then the old first
        new, old = read_snapshot(store, kafka), read_snapshot_before(store, kafka)
        assert new.database_error is None and old.database_error is None
        mine_new = {j.job: j for j in new.jobs if j.job in jobs}
        mine_old = {j.job: j for j in old.jobs if j.job in jobs}
        assert sorted(mine_new) == sorted(mine_old) == sorted(jobs[:3])  # the retired one left out
        assert jobs[3] in new.retired and jobs[3] in old.retired and new.retired == old.retired
        assert [j.job for j in new.jobs] == [j.job for j in old.jobs]
        for job in jobs[:3]:
            _same(mine_new[job], mine_old[job])
        assert (new.stats_error, new.extra) == (old.stats_error, old.extra)
        # what the scenarios are there for: each case is in the answer
        a = {(p.topic, p.partition): p for p in mine_new[jobs[0]].partitions}
        assert a[(f"t-{tag}", 1)].out_of_log and a[(f"t-{tag}", 1)].lost == 5
        assert a[(f"t-{tag}", 3)].end == 130 and not a[(f"t-{tag}", 3)].out_of_log  # a proven end
        assert a[(f"u-{tag}", 5)].out_of_log  # moved before the facts: past the end
        assert a[(f"t-{tag}", 4)].offset is None and a[(f"t-{tag}", 4)].lag == 104 - 40  # not stored
        assert a[(f"t-{tag}", 2)].lag_seconds is None and a[(f"u-{tag}", 4)].lag_seconds == 0.0
        assert set(mine_new[jobs[1]].topic_errors) == {f"r-{tag}-refused", f"x-{tag}-unknown"}
        store_new, store_old = new.store, old.store
        assert store_new is not None and store_old is not None
