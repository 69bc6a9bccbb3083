"""docker-compose.yml cannot run here (no Docker engine), so check its shape: services, versions,
healthchecks, loopback ports and the migrate-before-job ordering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from txn_offsets.devstack import kafka as local_kafka

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_services_present(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "kafka", "migrate", "job", "serve"}


def test_same_major_versions_as_the_local_stack(compose: dict[str, Any]) -> None:
    assert compose["services"]["postgres"]["image"].split(":")[1].split(".")[0] == "15"
    kafka_tag = compose["services"]["kafka"]["image"]
    assert kafka_tag.startswith("apache/kafka:")
    assert kafka_tag.split(":")[1].split(".")[0] == local_kafka.KAFKA_VERSION.split(".")[0]


@pytest.mark.parametrize("name", ["postgres", "kafka", "serve"])
def test_services_have_healthchecks_and_loopback_ports(compose: dict[str, Any], name: str) -> None:
    svc = compose["services"][name]
    assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    assert int(svc["healthcheck"]["retries"]) > 0
    for port in svc["ports"]:
        assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_kafka_single_node_kraft_with_replication_one(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1


def test_migrate_runs_before_the_job(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert "txn-offsets db upgrade" in " ".join(migrate["command"])
    assert "examples.migrate" in " ".join(migrate["command"])
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    job_deps = compose["services"]["job"]["depends_on"]
    assert job_deps["migrate"]["condition"] == "service_completed_successfully"
    assert job_deps["kafka"]["condition"] == "service_healthy"
    assert job_deps["postgres"]["condition"] == "service_healthy"


def test_job_and_migrate_share_the_connection_settings(compose: dict[str, Any]) -> None:
    job_env = compose["services"]["job"]["environment"]
    assert job_env == compose["services"]["migrate"]["environment"]
    assert job_env["TXN_OFFSETS_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert job_env["TXN_OFFSETS_KAFKA_BOOTSTRAP"] == "kafka:19092"


def test_serve_waits_for_the_schema_and_checks_its_health(compose: dict[str, Any]) -> None:
    serve = compose["services"]["serve"]
    assert serve["command"][:2] == ["txn-offsets", "serve"]
    assert "/healthz" in " ".join(serve["healthcheck"]["test"])
    assert serve["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert serve["depends_on"]["kafka"]["condition"] == "service_healthy"
    env = serve["environment"]
    assert (
        env["TXN_OFFSETS_DATABASE_URL"]
        == compose["services"]["job"]["environment"]["TXN_OFFSETS_DATABASE_URL"]
    )
    # the token is passed through from the host's environment, never written here
    assert env["TXN_OFFSETS_SERVE_TOKEN"] == "${TXN_OFFSETS_SERVE_TOKEN:-}"


def test_postgres_keeps_statement_statistics_as_the_local_stack_does(compose: dict[str, Any]) -> None:
    """benchmarks/pg_statements.py reads pg_stat_statements: loaded at start, created by an init
    script that the image runs on its first start (a file of the repository, mounted read-only)."""
    pg = compose["services"]["postgres"]
    assert "shared_preload_libraries=pg_stat_statements" in pg["command"]
    mounts = [v for v in pg["volumes"] if v.endswith(":/docker-entrypoint-initdb.d:ro")]
    assert len(mounts) == 1
    scripts = COMPOSE.parent / mounts[0].split(":")[0]
    text = "\n".join(p.read_text() for p in sorted(scripts.glob("*.sql")))
    assert "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" in text
