"""The whole lab (marked ``lab``: minutes, root; ``make test-lab``): ``lab up`` from nothing, then
from the driver host a transactional producer commits into a replication-3 topic and a
read_committed consumer reads exactly what was committed; worker-1 writes to pg-1 with plain
psycopg and the row reaches the replica on pg-2; both Spark workers are registered and see neither
txn_offsets nor the venv; ``lab down`` leaves no namespace, name file or process."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txn_offsets.devstack import read_env_file
from txn_offsets.devstack.lab import spark
from txn_offsets.devstack.lab.net import ETC_NETNS, Network
from txn_offsets.devstack.lab.spawn import hidden_paths, run_in

pytestmark = pytest.mark.lab

CHECKOUT = Path(__file__).resolve().parents[2]

KAFKA_SCRIPT = """
import json, os, sys
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
servers = os.environ["TXN_OFFSETS_KAFKA_BOOTSTRAP"]
topic = sys.argv[1]
admin = AdminClient({"bootstrap.servers": servers})
admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=3)])[topic].result(30)
producer = Producer({"bootstrap.servers": servers, "transactional.id": "lab-" + topic})
producer.init_transactions(60)
producer.begin_transaction()
for i in range(10):
    producer.produce(topic, b"committed-%d" % i, partition=i % 2)
producer.commit_transaction(60)
producer.begin_transaction()
for i in range(5):
    producer.produce(topic, b"aborted-%d" % i, partition=i % 2)
producer.flush(30)
producer.abort_transaction(60)
consumer = Consumer({"bootstrap.servers": servers, "group.id": "lab-" + topic,
                     "isolation.level": "read_committed", "enable.auto.commit": False})
consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
seen = []
for _ in range(60):
    msg = consumer.poll(1.0)
    if msg is not None and msg.error() is None:
        seen.append(msg.value().decode())
    if len(seen) >= 10:
        break
for _ in range(3):  # anything after the commit (the aborted records) would come now
    msg = consumer.poll(1.0)
    if msg is not None and msg.error() is None:
        seen.append(msg.value().decode())
consumer.close()
meta = admin.list_topics(topic, timeout=10).topics[topic].partitions
print(json.dumps({"seen": sorted(seen),
                  "replicas": sorted(len(p.replicas) for p in meta.values()),
                  "isr": sorted(len(p.isrs) for p in meta.values())}))
"""

PG_SCRIPT = """
import os, psycopg, socket
url = os.environ["TXN_OFFSETS_OWNER_DATABASE_URL"].replace("+psycopg", "")
with psycopg.connect(url, connect_timeout=10) as conn:
    conn.execute("CREATE TABLE lab_probe (host text, at timestamptz DEFAULT now())")
    conn.execute("INSERT INTO lab_probe (host) VALUES (host(inet_client_addr()))")
    print(conn.execute("SELECT host FROM lab_probe").fetchone()[0])
"""


def lab_cmd(lab_dir: Path, action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txn_offsets.devstack.lab", action, "--lab-dir", str(lab_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CHECKOUT,
        check=False,
    )


def lab_rss_mb(net: Network) -> float:
    total = 0
    for ns in net.namespaces():
        for pid in net.pids(ns):
            status = Path(f"/proc/{pid}/status")
            rss = next((line for line in status.read_text().splitlines() if line.startswith("VmRSS:")), "")
            total += int(rss.split()[1]) if rss else 0
    return total / 1024


@pytest.fixture
def lab_dir(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "the lab test needs root (network namespaces, mounts)"
    left = Network().leftovers()
    assert not left, f"a lab is running ({'; '.join(left)}): run `make lab-down` first"
    try:
        yield tmp_path / "lab"
    finally:
        lab_cmd(tmp_path / "lab", "down")


def test_lab_up_serves_kafka_postgres_and_spark_then_down_leaves_nothing(lab_dir: Path) -> None:
    up = lab_cmd(lab_dir, "up")
    assert up.returncode == 0, up.stderr[-3000:]
    took = re.search(r"lab up in ([0-9.]+) s", up.stdout)
    assert took, up.stdout
    net = Network()
    env = read_env_file(lab_dir / "env")
    assert env["TXN_OFFSETS_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    host_env = {**os.environ, **env}

    # Kafka from the driver host, by the lab's names: a transaction committed, one aborted
    kafka = run_in(
        net, "driver", [sys.executable, "-c", KAFKA_SCRIPT, "lab_probe"], env=host_env, timeout_s=240
    )
    assert kafka.returncode == 0, kafka.stderr[-3000:]
    got = json.loads(kafka.stdout.strip().splitlines()[-1])
    assert got == {"seen": sorted(f"committed-{i}" for i in range(10)), "replicas": [3, 3], "isr": [3, 3]}

    # PostgreSQL: worker-1 writes to pg-1 across the bridge (the server sees worker-1's address)
    write = run_in(net, "worker-1", [sys.executable, "-c", PG_SCRIPT], env=host_env, timeout_s=60)
    assert write.returncode == 0, write.stderr[-2000:]
    assert write.stdout.strip() == "10.47.45.32"
    replica_url = env["TXN_OFFSETS_REPLICA_DATABASE_URL"].replace("+psycopg", "")
    read_replica = (
        "import psycopg, sys, time\n"
        "for _ in range(50):\n"
        "    with psycopg.connect(sys.argv[1], connect_timeout=10) as c:\n"
        "        if c.execute(\"SELECT to_regclass('lab_probe')\").fetchone()[0]:\n"
        "            print(c.execute('SELECT count(*) FROM lab_probe').fetchone()[0]); break\n"
        "    time.sleep(0.2)\n"
    )
    replica = run_in(net, "driver", [sys.executable, "-c", read_replica, replica_url], timeout_s=60)
    assert (replica.returncode, replica.stdout.strip()) == (0, "1"), replica.stderr[-2000:]

    # Spark: both workers registered; their view has no txn_offsets, no venv, and the nodes' Python
    python = env["LAB_NODE_PYTHON"]
    daemons = spark.Daemons(net, lab_dir.resolve() / "run", python, hidden_paths(python))
    assert daemons.alive_workers() == ["10.47.45.32", "10.47.45.33"]
    for worker in ("worker-1", "worker-2"):
        pid = int((lab_dir / "run" / worker / "spark.pid").read_text())
        root = Path(f"/proc/{pid}/root")  # the running worker's own mount namespace
        assert list((root / sys.prefix.lstrip("/")).iterdir()) == []
        assert not (root / str(CHECKOUT / "txn_offsets" / "__init__.py").lstrip("/")).exists()
        assert (
            root / str(lab_dir.resolve() / "run" / "spark-home" / "bin" / "spark-class").lstrip("/")
        ).exists()
    probe = "import importlib.util, sys; print(importlib.util.find_spec('txn_offsets'), sys.executable)"
    plain = run_in(
        net, "worker-1", [python, "-c", probe], view=daemons.view, env={"PATH": "/usr/bin"}, cwd=lab_dir
    )
    assert (plain.returncode, plain.stdout.split()) == (0, ["None", python]), plain.stderr
    rss = lab_rss_mb(net)
    print(f"\nlab up took {took.group(1)} s; the lab's processes hold {rss:.0f} MB RSS")

    down = lab_cmd(lab_dir, "down")
    assert down.returncode == 0, down.stderr
    assert "nothing named txo-* is left" in down.stdout
    assert net.leftovers(str(lab_dir.resolve() / "run")) == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert "txo-" not in names
    assert not ETC_NETNS.is_dir() or not list(ETC_NETNS.glob("txo-*"))
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(lab_dir).encode() in _read(p)]
    run = lab_dir.resolve() / "run"  # the servers' data outside the lab's directory (0700 tmp) is gone
    for where in (run / "pg-1", run / "pg-2", run / "pg-1" / "pgbouncer"):
        assert not (
            Path("/var/lib/txn-offsets") / hashlib.sha256(str(where).encode()).hexdigest()[:12]
        ).exists()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_lab_up_refuses_leftovers_and_down_removes_them(lab_dir: Path) -> None:
    subprocess.run(["ip", "netns", "add", "txo-stray"], check=True)
    started = time.monotonic()
    refused = lab_cmd(lab_dir, "up")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "namespace txo-stray" in refused.stderr and "make lab-down" in refused.stderr
    assert time.monotonic() - started < 30
    down = lab_cmd(lab_dir, "down")
    assert (down.returncode, down.stdout.strip()) == (
        0,
        "lab down: 1 namespaces removed; nothing named txo-* is left",
    )
    assert Network().leftovers() == []
