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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import KafkaError, KafkaException, TopicCollection
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
    # False in make test's smoke: F2 fires only its five forced faults (one per point), none drawn
    drawn_faults: bool = True
    rng: random.Random = field(init=False)
    engine: sa.Engine = field(init=False)
    admin_engine: sa.Engine = field(init=False)
    admin: AdminClient = field(init=False)
    topics: list[str] = field(default_factory=list)
    partitions: dict[str, int] = field(default_factory=dict)  # of each topic made here
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
        """A fresh schema with the offsets tables (migrated), the result tables and the triggers.
        A name that exists already (left by a run with --keep or a killed one, same seed) gets a
        suffix: the seeded names of everything after it stay the same."""
        base = validate_identifier(self.name("chaos"), "schema")
        for schema in (base, *(f"{base}_{n}" for n in range(1, 10))):
            with self.engine.connect() as conn:
                taken = conn.execute(
                    sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
                ).scalar_one()
            if not taken:
                break
            logger.warning("chaos: schema %s exists (left by another run); adding a suffix", schema)
        else:
            raise RuntimeError(f"chaos: schemas {base} and {base}_1..9 all exist: drop the leftovers")
        self.schemas.append(schema)
        migrate.upgrade(DatabaseSettings(self.services.database_url, schema=schema))
        t = tables(schema)
        with self.engine.begin() as conn:
            t.counts.metadata.create_all(conn)
            install_history(conn, schema)
        return schema

    def topic(self, partitions: int, config: dict[str, str] | None = None) -> str:
        """A fresh topic. A name that exists already (left by a run with --keep or a killed one,
        same seed) gets a suffix: the seeded names (and fault decisions) after it stay the same."""
        base = self.name("chaos").replace("_", "-")
        for name in (base, *(f"{base}-{n}" for n in range(1, 10))):
            fut = self.admin.create_topics(
                [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
            )[name]
            try:
                fut.result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                logger.warning("chaos: topic %s exists (left by another run); adding a suffix", name)
                continue
            self.topics.append(name)
            self.partitions[name] = partitions
            return name
        raise RuntimeError(f"chaos: topics {base} and {base}-1..9 all exist: delete the leftovers")

    def recreate_topic(self, name: str, partitions: int, timeout_s: float = 60.0) -> None:
        """F12: delete `name` and create it again, same name and partition count, a new topic id.
        Kafka deletes asynchronously: creating is retried (bounded) while the old one lingers."""
        self.admin.delete_topics([name], operation_timeout=30)[name].result(timeout=30)
        deadline = time.monotonic() + timeout_s
        while True:
            fut = self.admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
            try:
                fut[name].result(timeout=30)
                break
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        while time.monotonic() < deadline:  # every partition has a leader before anyone produces
            md = self.admin.list_topics(name, timeout=10).topics.get(name)
            led = [] if md is None or md.error is not None else [p.leader for p in md.partitions.values()]
            if len(led) == partitions and min(led) >= 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"topic {name} was re-created but has no leaders after {timeout_s:.0f}s")

    def topic_id(self, name: str) -> str:
        """The Kafka topic id of `name` (changes when a topic is deleted and re-created)."""
        return str(self.admin.describe_topics(TopicCollection([name]))[name].result(30).topic_id)

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
        # each batch capped in all too, at what the partition caps allow (the same batches): a job
        # catching up plans its next batch from the last one's, so every scenario runs carried plans
        known = [self.partitions[t] for t in topics if t in self.partitions]
        if max_per_partition > 0 and len(known) == len(topics) and "--low-latency" not in args:
            per_job = max(known) if "--many" in args else sum(known)  # --many: a job per topic
            args += ["--max-per-batch", str(max_per_partition * per_job)]
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
        earlier: Sequence[KafkaLog] = (),
    ) -> None:
        check = check_run(
            self.engine, schema=schema, job=job, log=log, final=final, excluded=excluded, earlier=earlier
        )
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
    """Everything a run that must change nothing could change: the job's offset rows (every
    column: offset, topic id, updated_at), its audit rows, the results and the offset history."""
    s = f'"{validate_identifier(schema, "schema")}"'
    with ctx.engine.connect() as conn:
        offsets = conn.execute(
            sa.text(f"SELECT * FROM {s}.offsets WHERE job = :j ORDER BY topic, part"), {"j": job}
        ).all()
        audits = conn.execute(
            sa.text(f"SELECT * FROM {s}.offset_audit WHERE job = :j ORDER BY id"), {"j": job}
        ).all()
        counts = conn.execute(sa.text(f"SELECT topic, k, n FROM {s}.chaos_counts ORDER BY 1, 2")).all()
        history = conn.execute(sa.text(f"SELECT count(*) FROM {s}.chaos_offset_history")).scalar()
    return ([tuple(r) for r in offsets], [tuple(r) for r in audits], [tuple(r) for r in counts], history)


SNAPSHOT_PARTS = ("offset rows", "audit rows", "results", "offset history")


def changed(before: tuple[object, ...], after: tuple[object, ...]) -> list[str]:
    """What differs between two snapshots, by name (empty: nothing changed)."""
    return [name for name, a, b in zip(SNAPSHOT_PARTS, before, after, strict=True) if a != b]


def new_job_id() -> str:
    return uuid.uuid4().hex[:10]
