"""What the numbers were measured on: cores, memory, CPU model and every component's version."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from txn_offsets.devstack.kafka import KAFKA_VERSION, cache_dir


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "unknown"


def _memory_gib() -> float | None:
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    except OSError:
        return None
    return round(int(match.group(1)) / 2**20, 1) if match else None


def _java() -> str:
    try:
        from txn_offsets._java import find_java

        done = subprocess.run(
            [find_java(), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except Exception as exc:
        return f"unknown ({exc})"
    return (done.stderr or done.stdout).splitlines()[0].strip() if (done.stderr or done.stdout) else "unknown"


def _connector() -> str:
    marker = cache_dir() / f"spark-kafka-{_package('pyspark')}" / ".complete"
    return marker.read_text().strip() if marker.exists() else "not fetched"


def describe(engine: sa.Engine) -> dict[str, Any]:
    import confluent_kafka

    with engine.connect() as conn:
        postgres = str(conn.execute(sa.text("SHOW server_version")).scalar())
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": _java(),
        "pyspark": _package("pyspark"),
        "spark_kafka_connector": _connector(),
        "kafka_broker": KAFKA_VERSION,
        "postgresql": postgres,
        "confluent_kafka": _package("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "sqlalchemy": _package("SQLAlchemy"),
        "psycopg": _package("psycopg"),
        "txn_offsets": _package("txn-offsets"),
    }


def summary(machine: dict[str, Any]) -> str:
    return (
        f"{machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB RAM, {machine['os']}; "
        f"Python {machine['python']}, {machine['java']}, pyspark {machine['pyspark']} "
        f"(Kafka connector {machine['spark_kafka_connector']}), Kafka {machine['kafka_broker']}, "
        f"PostgreSQL {machine['postgresql']}, confluent-kafka {machine['confluent_kafka']} "
        f"(librdkafka {machine['librdkafka']}), SQLAlchemy {machine['sqlalchemy']}, "
        f"psycopg {machine['psycopg']}"
    )
