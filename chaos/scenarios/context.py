"""What every scenario shares: the services, the seeded :class:`Context` that makes and cleans up
topics, schemas and job processes, the checks, and the registry the families add themselves to.

Every random choice comes from the session's seeded generator, so a seed replays the same faults
at the same points (Spark's thread timing aside). Every wait is bounded by a deadline; every job
process is reaped by :mod:`chaos.procs`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from chaos.faults import FaultPlan, tables
from chaos.invariants import KafkaLog, check_run, install_history, read_log
from chaos.procs import REPO, JobProcess, JobResult
from chaos.report import ScenarioResult
from examples import pageviews
from txn_offsets.config import DatabaseSettings, validate_identifier
from txn_offsets.store import migrate

__all__ = ["JOB_TIMEOUT_S", "SCENARIOS", "Context", "Scenario", "Services", "scenario"]

logger = logging.getLogger(__name__)

JOB_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Services:
    database_url: str
    admin_database_url: str
    kafka_bootstrap: str
    stack_dir: Path | None  # None: PostgreSQL/Kafka cannot be restarted from here


@dataclass
class Context:
    """What every scenario needs: services, the seeded generator, and cleanup of what it made."""

    services: Services
    seed: int
    work_dir: Path
    keep: bool = False
    rng: random.Random = field(init=False)
    engine: sa.Engine = field(init=False)
    admin_engine: sa.Engine = field(init=False)
    admin: AdminClient = field(init=False)
    topics: list[str] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # pre_ping: connections outlive Postgres restarts (F3) in these pools
        self.engine = sa.create_engine(self.services.database_url, pool_pre_ping=True, hide_parameters=True)
        self.admin_engine = sa.create_engine(
            self.services.admin_database_url, pool_pre_ping=True, hide_parameters=True
        )
        self.admin = AdminClient({"bootstrap.servers": self.services.kafka_bootstrap})

    # --- resources -------------------------------------------------------------------------
    def name(self, prefix: str) -> str:
        return f"{prefix}_{self.rng.getrandbits(48):012x}"

    def schema(self) -> str:
        """A fresh schema with the offsets tables (migrated), the result tables and the triggers."""
        schema = validate_identifier(self.name("chaos"), "schema")
        self.schemas.append(schema)
        migrate.upgrade(DatabaseSettings(self.services.database_url, schema=schema))
        t = tables(schema)
        with self.engine.begin() as conn:
            t.counts.metadata.create_all(conn)
            install_history(conn, schema)
        return schema

    def topic(self, partitions: int, config: dict[str, str] | None = None) -> str:
        name = self.name("chaos").replace("_", "-")
        fut = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )[name]
        fut.result(timeout=30)
        self.topics.append(name)
        return name

    def produce(self, topic: str, messages: int, partitions: int) -> pageviews.Oracle:
        """Committed page views in Kafka transactions, every 10th aborted (F10, in every scenario)."""
        return pageviews.produce(
            self.services.kafka_bootstrap,
            topic,
            messages,
            partitions=partitions,
            per_transaction=2_000,
            abort_every=10,
            seed=self.rng.getrandbits(32),
        )

    def log(self, topics: Mapping[str, int]) -> KafkaLog:
        return read_log(self.services.kafka_bootstrap, topics)

    def cleanup(self) -> None:
        if self.keep:
            return
        for schema in self.schemas:
            with contextlib.suppress(sa.exc.SQLAlchemyError), self.engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        if self.topics:
            for fut in self.admin.delete_topics(self.topics, operation_timeout=30).values():
                with contextlib.suppress(KafkaException):
                    fut.result(timeout=30)
        self.engine.dispose()
        self.admin_engine.dispose()

    # --- jobs ------------------------------------------------------------------------------
    def job(
        self,
        run_dir: Path,
        *,
        job: str,
        schema: str,
        topics: list[str],
        max_per_partition: int,
        faults: FaultPlan | None = None,
        extra: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> JobProcess:
        run_dir.mkdir(parents=True, exist_ok=True)
        plan = faults or FaultPlan(seed=self.seed)
        args = [
            "--job",
            job,
            "--topics",
            ",".join(topics),
            "--schema",
            schema,
            "--kafka-bootstrap",
            self.services.kafka_bootstrap,
            "--app-name",
            app_name(job),
            "--max-per-partition",
            str(max_per_partition),
            "--run-dir",
            str(run_dir),
            "--faults",
            json.dumps({k: v for k, v in asdict(plan).items() if k != "driver_pid"}),
            *(extra or []),
        ]
        full_env = {
            **os.environ,
            "TXN_OFFSETS_DATABASE_URL": self.services.database_url,
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        return JobProcess(args, full_env, run_dir / "job.log")

    def stored(self, schema: str, job: str) -> dict[tuple[str, int], int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f'SELECT topic, part, off FROM "{schema}".offsets WHERE job = :j'), {"j": job}
            )
            return {(r.topic, r.part): int(r.off) for r in rows}

    def wait_caught_up(
        self, jp: JobProcess, schema: str, job: str, ends: Mapping[tuple[str, int], int], timeout_s: float
    ) -> bool:
        """Until the stored offsets reach `ends` (True) or the job exits / the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and jp.running():
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                if self.stored(schema, job) == dict(ends):
                    return True
            time.sleep(0.5)
        return False

    def check(
        self,
        result: ScenarioResult,
        *,
        schema: str,
        job: str,
        log: KafkaLog,
        final: bool,
        when: str,
        excluded: Mapping[tuple[str, int], list[tuple[int, int]]] | None = None,
    ) -> None:
        check = check_run(self.engine, schema=schema, job=job, log=log, final=final, excluded=excluded)
        result.add(check, when=when)


def app_name(job: str) -> str:
    return f"chaos-{job}"[:63]


def wait_file(path: Path, jp: JobProcess, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and jp.running():
        if path.exists():
            return True
        time.sleep(0.1)
    return path.exists()


def expect_ok(result: ScenarioResult, res: JobResult, what: str) -> None:
    if res.returncode != 0:
        result.fail(f"{what}: job exited {res.returncode}: {res.last_error() or res.log[-800:]}")


def producer_matches(result: ScenarioResult, log: KafkaLog, *oracles: pageviews.Oracle) -> None:
    """The producer's own count must equal what Kafka holds: guards the oracle itself."""
    produced = sum(o.messages for o in oracles)
    if log.records != produced:
        result.fail(f"oracle: Kafka holds {log.records} committed records, the producer committed {produced}")


Scenario = Callable[[Context, int, int], ScenarioResult]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


def snapshot(ctx: Context, schema: str, job: str) -> tuple[object, ...]:
    with ctx.engine.connect() as conn:
        counts = conn.execute(sa.text(f'SELECT topic, k, n FROM "{schema}".chaos_counts ORDER BY 1, 2')).all()
        history = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".chaos_offset_history')).scalar()
    return (ctx.stored(schema, job), [tuple(r) for r in counts], history)


def new_job_id() -> str:
    return uuid.uuid4().hex[:10]
