"""Real PostgreSQL and Kafka for the tests.

Where the services come from, first match wins:
1. ``--database-url`` / ``--kafka-bootstrap`` options, or TXN_OFFSETS_OWNER_DATABASE_URL (else
   TXN_OFFSETS_DATABASE_URL) / TXN_OFFSETS_KAFKA_BOOTSTRAP in the environment (``make test`` exports
   the local stack's);
2. testcontainers, when a Docker engine answers;
3. the embedded local stack (``txn_offsets.devstack``), started for the session.
Integration tests never skip: if no service can be had, the session errors loudly.

The tests administer the store (they migrate schemas, create tables and roles): they connect as the
database's owner. The local stack's env file names the run role TXN_OFFSETS_DATABASE_URL (what a
user's job runs as) and the owner TXN_OFFSETS_OWNER_DATABASE_URL, so :func:`pytest_configure` points
TXN_OFFSETS_DATABASE_URL at the owner for the session: subprocesses that inherit the environment
(jobs, the chaos and benchmark drivers) connect as the owner too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Services:
    database_url: str
    admin_database_url: str
    kafka_bootstrap: str
    origin: str  # "env", "testcontainers" or "embedded"

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) pointing a subprocess at these services and
        at this repository (TXN_OFFSETS_DATABASE_URL, TXN_OFFSETS_KAFKA_BOOTSTRAP, PYTHONPATH)."""
        return {
            **(os.environ if base is None else base),
            "TXN_OFFSETS_DATABASE_URL": self.database_url,
            "TXN_OFFSETS_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "PYTHONPATH": str(REPO),
        }


def run_module(
    module: str, *args: str, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m module args...`` in the repository with `env`, its output captured as text; its
    exit code is the caller's to check (never raised)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


OWNER_URL_ENV = "TXN_OFFSETS_OWNER_DATABASE_URL"


def pytest_configure(config: pytest.Config) -> None:
    """The session runs as the store's owner (the module's docstring): TXN_OFFSETS_DATABASE_URL is
    TXN_OFFSETS_OWNER_DATABASE_URL when the environment names one."""
    owner = os.environ.get(OWNER_URL_ENV)
    if owner:
        os.environ["TXN_OFFSETS_DATABASE_URL"] = owner


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("txn_offsets")
    group.addoption("--database-url", default=None, help="SQLAlchemy URL of a PostgreSQL the tests may use")
    group.addoption("--admin-database-url", default=None, help="superuser URL (defaults to --database-url)")
    group.addoption("--kafka-bootstrap", default=None, help="bootstrap servers of a Kafka the tests may use")


def _docker_available() -> bool:
    if os.environ.get("TXN_OFFSETS_TEST_DOCKER", "auto") == "0":
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _postgres_container() -> Iterator[Any]:
    from testcontainers.community.postgres import PostgresContainer

    # pg_stat_statements loaded and created, as the embedded stack has it (benchmarks/pg_statements.py)
    container = PostgresContainer("postgres:15", driver="psycopg").with_command(
        "postgres -c shared_preload_libraries=pg_stat_statements"
    )
    with container as pg:
        engine = sa.create_engine(pg.get_connection_url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        engine.dispose()
        yield pg


@contextlib.contextmanager
def _kafka_container() -> Iterator[str]:
    """apache/kafka (the official image, KRaft) - the same major version as the embedded stack.
    The advertised listener must name the host port, so the port is chosen before the start."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    from txn_offsets.devstack._proc import pick_free_port
    from txn_offsets.devstack.kafka import KAFKA_VERSION

    port = pick_free_port()
    container = (
        DockerContainer(f"apache/kafka:{KAFKA_VERSION}")
        .with_bind_ports(9092, port)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    with container:
        wait_for_logs(container, "Kafka Server started", timeout=120)
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def services(request: pytest.FixtureRequest) -> Iterator[Services]:
    opt = request.config.getoption
    db = opt("--database-url") or os.environ.get(OWNER_URL_ENV) or os.environ.get("TXN_OFFSETS_DATABASE_URL")
    kafka = opt("--kafka-bootstrap") or os.environ.get("TXN_OFFSETS_KAFKA_BOOTSTRAP")
    admin = opt("--admin-database-url") or os.environ.get("TXN_OFFSETS_ADMIN_DATABASE_URL") or db
    if db and kafka and admin:
        yield Services(db, admin, kafka, "env")
        return
    if _docker_available():
        with _postgres_container() as pg, _kafka_container() as bootstrap:
            url = pg.get_connection_url()
            yield Services(url, url, bootstrap, "testcontainers")
        return
    from txn_offsets.devstack import Stack

    stack = Stack(Path(os.environ.get("TXN_OFFSETS_STACK_DIR", REPO / ".stack")))
    stack.up()  # raises StackError with a fix if it cannot: the session fails, nothing skips
    env = stack.env()
    yield Services(
        env[OWNER_URL_ENV],
        env["TXN_OFFSETS_ADMIN_DATABASE_URL"],
        env["TXN_OFFSETS_KAFKA_BOOTSTRAP"],
        "embedded",
    )


@pytest.fixture(scope="session")
def database_url(services: Services) -> str:
    return services.database_url


@pytest.fixture(scope="session")
def admin_database_url(services: Services) -> str:
    return services.admin_database_url


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    return services.kafka_bootstrap


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[sa.Engine]:
    # pre-ping: the chaos smoke crash-restarts PostgreSQL, which kills pooled connections
    eng = sa.create_engine(database_url, pool_size=10, max_overflow=20, pool_pre_ping=True)
    yield eng
    eng.dispose()


@pytest.fixture
def pg_schema(engine: sa.Engine) -> Iterator[str]:
    """A fresh, empty Postgres schema name for this test (dropped afterwards)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


@pytest.fixture
def job_name() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(kafka_admin: AdminClient) -> Iterator[TopicFactory]:
    """Create fresh uuid-named topics: ``topic_factory(partitions=8, config={...})``."""
    created: list[str] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        fut = kafka_admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )[name]
        fut.result(timeout=30)
        created.append(name)
        _until_described(kafka_admin, name)
        return name

    yield make
    if created:
        for fut in kafka_admin.delete_topics(created, operation_timeout=30).values():
            with contextlib.suppress(KafkaException):
                fut.result(timeout=30)


def _until_described(admin: AdminClient, topic: str) -> None:
    """create_topics returns once the controller has the topic; the broker's metadata follows a
    moment later, and a look-up before then says it does not exist. Wait for it (bounded)."""
    deadline = time.monotonic() + 30
    while True:
        info = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            return
        assert time.monotonic() < deadline, f"{topic} not in the broker's metadata after 30 s"
        time.sleep(0.05)


@contextlib.contextmanager
def started_pgbouncer(
    services: Services, home: Path, pool_mode: str = "transaction", extra_roles: Sequence[str] = ()
) -> Iterator[str]:
    """A PgBouncer (Debian's, installed when missing and root) in front of the tests' PostgreSQL:
    `pool_mode`, default_pool_size=2, the app role's SCRAM secret (and `extra_roles`'); yields the
    app role's URL through it and stops it afterwards."""
    from txn_offsets.devstack import pgbouncer, postgres
    from txn_offsets.devstack._proc import pick_free_port

    app = sa.engine.make_url(services.database_url)
    admin = sa.engine.make_url(services.admin_database_url)
    user = postgres.service_user()
    bouncer = pgbouncer.Bouncer(
        home=pgbouncer.home_for(home, user),
        pid_file=home.parent / f"{home.name}.pid",
        port=pick_free_port(),
        upstream_host=str(app.host),
        upstream_port=int(app.port or 5432),
        os_user=user,
        pool_mode=pool_mode,
        admin_user=str(admin.username),
    )
    conninfo = {
        "host": admin.host,
        "port": admin.port or 5432,
        "user": admin.username,
        "password": admin.password,
        "dbname": admin.database,
        "connect_timeout": 5,
    }
    pgbouncer.start(bouncer, conninfo, sorted({str(app.username), str(admin.username), *extra_roles}))
    try:
        yield app.set(host="127.0.0.1", port=bouncer.port).render_as_string(hide_password=False)
    finally:
        pgbouncer.stop(bouncer)


@pytest.fixture(scope="session")
def pooled_database_url(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tests' database through PgBouncer in transaction mode with a pool of 2:
    TXN_OFFSETS_POOLED_DATABASE_URL (`make stack-up POOLER=pgbouncer`), else one started for the session."""
    url = os.environ.get("TXN_OFFSETS_POOLED_DATABASE_URL")
    if url:
        yield url
        return
    with started_pgbouncer(services, tmp_path_factory.mktemp("pgbouncer") / "transaction") as url:
        yield url
