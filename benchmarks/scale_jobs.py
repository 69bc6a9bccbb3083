"""The scale phase's many jobs, in a worker process: N jobs on threads of one Spark application
(txn_offsets.spark.many.run_jobs, FAIR pools) each over a topic of its own, vs ONE job over all N
topics (the same records, ranges and total parallelism). While they run, a sampler watches
PostgreSQL: the connections of this bench (``application_name``) and every lock wait of one of
them, with the application_name of the backends blocking it.

Each job's batches are capped at ``batch_records`` offsets; the one job at N x that, so both read
the same number of batches. The result rows of every topic are checked against its oracle:
``exact`` is whether all of them (and every job's record count) were right.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa

from benchmarks import sink
from benchmarks.dataset import Dataset
from examples import windowed_counts
from txn_offsets import Limits, StartPolicy, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.spark.many import run_jobs
from txn_offsets.store.database import engine_for

SAMPLE_EVERY_S = 0.2
# what a PostgreSQL backend says it is waiting for (no values: the store binds them all)
_WAITS = sa.text(
    "SELECT w.pid, w.application_name AS app, l.locktype, l.mode, "
    "coalesce(l.relation::regclass::text, '') AS relation, left(w.query, 60) AS query, "
    "array(SELECT b.application_name || ':' || b.pid FROM pg_stat_activity b "
    "      WHERE b.pid = ANY(pg_blocking_pids(w.pid))) AS blockers "
    "FROM pg_locks l JOIN pg_stat_activity w ON w.pid = l.pid "
    "WHERE NOT l.granted AND w.application_name = :app"
)
_CONNECTIONS = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app")


def tagged(db: DatabaseSettings, app: str) -> DatabaseSettings:
    """`db` with libpq's application_name set: the sampler tells this bench's backends apart."""
    url = sa.engine.make_url(db.url).update_query_dict({"application_name": app})
    return DatabaseSettings(url.render_as_string(hide_password=False), schema=db.schema)


class PgSampler:
    """Samples the tagged backends every SAMPLE_EVERY_S on a thread: peak connections, lock waits."""

    def __init__(self, db: DatabaseSettings, app: str) -> None:
        self.app = app
        own = sa.engine.make_url(db.url).difference_update_query(["application_name"])  # not counted
        self.engine = engine_for(DatabaseSettings(own.render_as_string(hide_password=False)), pool_size=1)
        self.peak = 0
        self.samples = 0
        self.waits: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pg-sampler", daemon=True)

    def __enter__(self) -> PgSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.engine.dispose()

    def _run(self) -> None:
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                now = time.perf_counter()
                self.peak = max(self.peak, int(conn.execute(_CONNECTIONS, {"app": self.app}).scalar_one()))
                for row in conn.execute(_WAITS, {"app": self.app}).mappings():
                    self.waits.append({"at": now, **{k: row[k] for k in row.keys()}})  # noqa: SIM118
                conn.rollback()
                self.samples += 1
                self._stop.wait(SAMPLE_EVERY_S)


def run(  # noqa: PLR0917 - the worker's command passes them by name
    spark: Any,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    datasets: list[Dataset],
    batch_records: int,
    mode: str,
    app: str,
) -> dict[str, Any]:
    """`mode` "many": one job per dataset, on threads (run_jobs); "one": one job over them all."""
    engine = engine_for(db)
    for data in datasets:
        sink.clear(engine, data.topic)
    common: dict[str, Any] = {
        "kafka": kafka,
        "database": db,
        "writer": windowed_counts.WRITER,
        "start": StartPolicy.earliest(),
        "until_caught_up": True,
        "batch_interval_s": 0.0,
    }
    tag = uuid.uuid4().hex[:6]
    counted: dict[str, int] = {}
    errors: dict[str, str] = {}
    with PgSampler(db, app) as sampler:
        t0 = time.perf_counter()
        if mode == "many":
            jobs = {
                f"bench-jobs-{tag}-{i:02d}": {
                    **common,
                    "topics": [d.topic],
                    "limits": Limits(max_records_per_batch=batch_records),
                }
                for i, d in enumerate(datasets)
            }
            result = run_jobs(spark, jobs)
            counted = {name: s.records for name, s in result.summaries.items()}
            errors = {name: f"{type(e).__name__}: {e}" for name, e in result.errors.items()}
        else:
            summary = run_job(
                spark,
                job=f"bench-jobs-{tag}-all",
                topics=[d.topic for d in datasets],
                limits=Limits(max_records_per_batch=batch_records * len(datasets)),
                **common,
            )
            counted = {summary.job: summary.records}
        seconds = time.perf_counter() - t0
    records = sum(d.messages for d in datasets)
    wrong = [d.topic for d in datasets if not _right(engine, d)]
    for data in datasets:
        sink.clear(engine, data.topic)
    engine.dispose()
    exact = not errors and not wrong and sum(counted.values()) == records
    if mode == "many":
        exact = exact and sorted(counted.values()) == sorted(d.messages for d in datasets)
    return {
        "mode": mode,
        "jobs": len(datasets) if mode == "many" else 1,
        "seconds": seconds,
        "records": records,
        "records_per_s": records / seconds,
        "exact": exact,
        "wrong_topics": wrong,
        "errors": errors,
        "peak_connections": sampler.peak,
        "samples": sampler.samples,
        "lock_waits": len(sampler.waits),
        "waits": sampler.waits[:50],
    }


def _right(engine: sa.Engine, data: Dataset) -> bool:
    try:
        sink.check(engine, data.topic, data.expected, f"jobs {data.topic}")
    except sink.WrongResult:
        return False
    return True


def connection_budget(jobs: int, task_slots: int) -> int:
    """The connections the documented sizing allows: each job's driver engine (its plan/commit,
    lease and statistics connections: 3) plus 4 per task slot (a Python worker's engine:
    pool_size=2 + max_overflow=2, shared by all jobs). The store's own configured budget, when it
    has one, replaces this."""
    return 3 * jobs + 4 * task_slots
