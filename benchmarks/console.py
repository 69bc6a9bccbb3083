"""The console's render time at scale: 32 jobs x 4,096 partitions seeded in a schema of their own,
the jobs overview and a job's page (its first and last page of partitions) each asked N times of
the service's app (the request in full: auth, the store read in a worker thread, the statuses,
the HTML), p50/p99 in milliseconds; and a few overviews that each read a new snapshot of all
131,072 rows (what a scrape of /metrics costs, and the overview once per Kafka cache age). A
figure, not a timed test.

The snapshot alone (``snapshot``): :func:`~txn_offsets.service.snapshot.read_snapshot` against the
read before its set-based rewrite (:mod:`benchmarks.snapshot_before`), alternated on the same
store, p50 and min in milliseconds. ``--own-topics``: each job reads a topic of its own (32 topics
of 4,096 partitions) instead of all jobs one topic.

Kafka's part is a stand-in that answers at once with a log start and end for every partition (the
service caches Kafka's facts for ``--kafka-cache-s``, 5 s, and a page between refreshes reads the
cache): the figure is the store read and the render, not a broker round trip.

    python -m benchmarks.console --jobs 32 --partitions 4096 --runs 50 [--own-topics]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from starlette.testclient import TestClient

from benchmarks.snapshot_before import read_snapshot_before
from benchmarks.stats import percentile
from benchmarks.store_scale import scratch_schema
from txn_offsets.config import DatabaseSettings, KafkaSettings, from_env
from txn_offsets.ranges import TopicPartition
from txn_offsets.service.app import Service, create_app
from txn_offsets.service.kafka_view import KafkaFacts, KafkaView
from txn_offsets.service.snapshot import read_snapshot
from txn_offsets.store.handle import Store

__all__ = ["measure", "seed_jobs"]

TOPIC = "bench-console"
END = 1_000_000  # every partition's end offset; each job stores END - its lag


class InstantKafka(KafkaView):
    """Facts for every partition asked about, at once (see the module)."""

    def __init__(self, kafka: KafkaSettings, partitions: int, ttl_s: float = 5.0) -> None:
        super().__init__(kafka, ttl_s=ttl_s)
        self.partitions = partitions

    def facts(self, stored: Mapping[TopicPartition, Collection[int]]) -> KafkaFacts:
        topics = frozenset(t for t, _ in stored)
        parts = {t: tuple(range(self.partitions)) for t in topics}
        marks = {(t, p): (0, END) for t in topics for p in range(self.partitions)}
        return KafkaFacts(topics, parts, marks, fetched_at=time.time())


def seed_jobs(
    engine: sa.Engine, db: DatabaseSettings, jobs: int, partitions: int, *, own_topics: bool = False
) -> list[str]:
    """`jobs` jobs, each with a live run and `partitions` stored offsets of one topic (the same for
    all, or `own_topics`: one each), a few commit and audit rows each; their names."""
    names = [f"bench-job-{i:03d}" for i in range(jobs)]
    s = f'"{db.schema}"'
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {s}.jobs (job, generation, run_id, run_host, lease_s, started_at, "  # noqa: S608
                "heartbeat_at, lease_until) SELECT j, 3, 'run-' || j, 'bench-host', 60, now(), now(), "
                "now() + interval '1 hour' FROM unnest(CAST(:jobs AS text[])) AS j"
            ),
            {"jobs": names},
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {s}.offsets (job, topic, part, off) "  # noqa: S608
                "SELECT j, CASE WHEN :own THEN :topic || '-' || j ELSE :topic END, p, :end - (p % 100) "
                "FROM unnest(CAST(:jobs AS text[])) AS j, generate_series(0, :n - 1) AS p"
            ),
            {"jobs": names, "topic": TOPIC, "n": partitions, "end": END, "own": own_topics},
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {s}.commits (job, topic, part, from_off, until_off, generation, run_id, "  # noqa: S608
                "batch) SELECT j, :topic, p, 0, 10, 3, 'run-' || j, 1 "
                "FROM unnest(CAST(:jobs AS text[])) AS j, "
                "generate_series(0, 15) AS p"
            ),
            {"jobs": names, "topic": TOPIC},
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {s}.offset_audit (job, topic, part, old_off, new_off, action, reason, actor, "  # noqa: S608
                "generation) SELECT j, :topic, 0, 10, 0, 'reset', 'bench', 'bench', 2 "
                "FROM unnest(CAST(:jobs AS text[])) AS j"
            ),
            {"jobs": names, "topic": TOPIC},
        )
        conn.execute(sa.text(f"ANALYZE {s}.offsets"))
    return names


def _timed(client: TestClient, path: str, runs: int, **params: str) -> dict[str, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(path, params=params)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text[:500]
    p50, p99 = percentile(times, 50), percentile(times, 99)
    assert p50 is not None  # runs >= 1
    assert p99 is not None
    return {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "max_ms": round(max(times), 1)}


def measure(
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    jobs: int = 32,
    partitions: int = 4096,
    runs: int = 50,
    uncached: int = 3,
    snapshots: int = 5,
    own_topics: bool = False,
) -> dict[str, Any]:
    """Seed a scratch schema, then time the pages and the snapshot (see the module)."""
    with scratch_schema(db, "bench_console") as (scratch, engine):
        started = time.perf_counter()
        names = seed_jobs(engine, scratch, jobs, partitions, own_topics=own_topics)
        seeded_s = time.perf_counter() - started
        pages: dict[str, Any] = {}
        # the Kafka cache's age (5 s, serve's default) is how long the overview shows the newest
        # snapshot; 0: every overview reads a new one, as a scrape of /metrics does
        for ttl_s, times in ((5.0, runs), (0.0, uncached)):
            service = Service(Store(engine, scratch), InstantKafka(kafka, partitions, ttl_s))
            try:
                with TestClient(create_app(service), base_url="http://127.0.0.1") as client:
                    client.get("/console/")  # warm: the connections, the statuses' first sight
                    if ttl_s == 0:
                        pages["overview_new_snapshot"] = _timed(client, "/console/", times)
                        continue
                    # within the cache's age: the snapshot the warm-up read (as a scrape would)
                    pages["overview"] = _timed(client, "/console/", times)
                    last = -(-partitions // 100)
                    pages["job_first_page"] = _timed(client, f"/console/jobs/{names[0]}", times)
                    pages["job_last_page"] = _timed(
                        client, f"/console/jobs/{names[-1]}", times, page=str(last)
                    )
            finally:
                service.close()
        snapshot = _snapshots(Store(engine, scratch), InstantKafka(kafka, partitions, 0.0), snapshots)
    return {
        "jobs": jobs,
        "partitions_per_job": partitions,
        "own_topics": own_topics,
        "runs": runs,
        "seed_s": round(seeded_s, 2),
        **pages,
        "snapshot": snapshot,
    }


def _snapshots(store: Store, kafka: KafkaView, runs: int) -> dict[str, Any]:
    """The snapshot read now and before its rewrite, alternated (each first in turn), `runs` each."""
    contenders = {"before": read_snapshot_before, "after": read_snapshot}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(runs):
        for name in sorted(contenders, reverse=bool(i % 2)):
            started = time.perf_counter()
            found = contenders[name](store, kafka)
            times[name].append((time.perf_counter() - started) * 1000)
            assert found.database_error is None, found.database_error
    out: dict[str, Any] = {"runs": runs}
    for name, taken in times.items():
        p50 = percentile(taken, 50)
        assert p50 is not None  # runs >= 1
        out[name] = {"p50_ms": round(p50, 1), "min_ms": round(min(taken), 1)}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--uncached", type=int, default=3, help="overviews that each read a new snapshot")
    parser.add_argument("--snapshots", type=int, default=5, help="snapshot reads of each contender")
    parser.add_argument("--own-topics", action="store_true", help="a topic of its own per job")
    args = parser.parse_args(argv)
    db, kafka = from_env()
    print(
        json.dumps(
            measure(
                db,
                kafka,
                jobs=args.jobs,
                partitions=args.partitions,
                runs=args.runs,
                uncached=args.uncached,
                snapshots=args.snapshots,
                own_topics=args.own_topics,
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
