"""The lab's pure parts: three nodes' server.properties, the hosts table and names file, the subnet
check, the leftovers report, the worker view's script, and the PostgreSQL client network block."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.devstack import kafka, postgres
from txn_offsets.devstack.lab import kafka3
from txn_offsets.devstack.lab.hosts import HOSTS, PREFIX, SUBNET, by_name, hosts_file, subnet_conflict
from txn_offsets.devstack.lab.net import Network, leftovers_from
from txn_offsets.devstack.lab.spawn import View
from txn_offsets.devstack.replica import multi_host_url


def props(node: kafka.KafkaNode) -> dict[str, str]:
    lines = kafka.config_lines(node)
    keys = [line.split("=", 1)[0] for line in lines]
    assert len(keys) == len(set(keys)), "a key written twice"
    return dict(line.split("=", 1) for line in lines)


def test_three_nodes_form_one_static_quorum_with_replication_3(tmp_path: Path) -> None:
    nodes = kafka3.nodes(Network(), tmp_path, tmp_path / "libs", "CLUSTER")
    configs = [props(n) for n in nodes]
    voters = "1@10.47.45.11:9093,2@10.47.45.12:9093,3@10.47.45.13:9093"
    for i, (node, conf) in enumerate(zip(nodes, configs, strict=True), 1):
        address = f"10.47.45.1{i}"
        assert conf["node.id"] == str(i)
        assert conf["controller.quorum.voters"] == voters
        assert "controller.quorum.bootstrap.servers" not in conf
        assert conf["listeners"] == f"PLAINTEXT://{address}:9092,CONTROLLER://{address}:9093"
        assert conf["advertised.listeners"] == f"PLAINTEXT://{address}:9092"
        assert conf["log.dirs"] == str(tmp_path / f"kafka-{i}" / "kafka" / "data")
        assert (node.cluster_id, node.bootstrap) == ("CLUSTER", f"{address}:9092")
        assert "-Xmx320m" in node.jvm_options
    for conf in configs:
        assert {k: conf[k] for k in (
            "default.replication.factor", "min.insync.replicas", "unclean.leader.election.enable",
            "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr",
        )} == {
            "default.replication.factor": "3", "min.insync.replicas": "2",
            "unclean.leader.election.enable": "false", "offsets.topic.replication.factor": "3",
            "transaction.state.log.replication.factor": "3", "transaction.state.log.min.isr": "2",
            "share.coordinator.state.topic.min.isr": "2",
        }  # fmt: skip
    assert kafka3.bootstrap(Network()) == "kafka-1:9092,kafka-2:9092,kafka-3:9092"


def test_the_stacks_single_node_is_unchanged(tmp_path: Path) -> None:
    node = kafka.KafkaNode(home=tmp_path, libs=tmp_path, port=9092, controller_port=9093)
    conf = props(node)
    assert conf["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert conf["transaction.state.log.replication.factor"] == "1" and "controller.quorum.voters" not in conf
    assert (node.bootstrap, node.jvm_options) == ("127.0.0.1:9092", ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC"))
    # an idle broker quiet: the controller's no-op records every 5 s, not every 0.5 s
    assert conf["metadata.max.idle.interval.ms"] == "5000"


def test_the_hosts_table() -> None:
    names = [h.name for h in HOSTS]
    assert names == [
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "pg-1",
        "pg-2",
        "spark-master",
        "worker-1",
        "worker-2",
        "driver",
        "driver-2",
    ]
    assert len({h.octet for h in HOSTS}) == len(HOSTS) and all(1 < h.octet < 255 for h in HOSTS)
    assert all(len(h.port) <= 15 and len(f"{PREFIX}{h.name}") <= 64 for h in HOSTS)
    assert by_name("pg-2").address == f"{SUBNET}.22"
    with pytest.raises(KeyError, match="kafka-1"):
        by_name("kafka-4")
    lines = hosts_file(by_name("worker-1"), "box").splitlines()
    assert lines[0] == "127.0.0.1 localhost" and "10.47.45.31 spark-master" in lines
    # localhost, every lab host, then the machine's name as this host
    assert lines[-1] == "10.47.45.32 box" and len(lines) == 1 + len(HOSTS) + 1
    assert len(hosts_file(by_name("driver"), "driver").splitlines()) == 1 + len(HOSTS)  # no name twice


@pytest.mark.parametrize(
    ("answer", "usable"),
    [
        ("10.47.45.1 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0\n    cache \n", True),
        ("RTNETLINK answers: Network is unreachable\n", True),
        ("10.47.45.1 dev br0 src 10.47.45.2 uid 0\n    cache \n", False),
        ("local 10.47.45.1 dev lo src 10.47.45.1 uid 0\n    cache <local> \n", False),
        ("", False),
    ],
)
def test_the_subnet_check(answer: str, usable: bool) -> None:
    problem = subnet_conflict(answer)
    assert (problem is None) == usable, problem


def test_leftovers_name_each_thing_left() -> None:
    found = leftovers_from(
        "txo-",
        "txo-sw (id: 0)\ntxo-kafka-1 (id: 3)\nother-ns\n",
        "lo UNKNOWN 00:00\neth0@if5 UP 02:fc\ntxo-x@if9 DOWN aa\n",
        ["txo-kafka-1", "unrelated"],
        {"txo-kafka-1": [12, 11, 12], "txo-sw": [], "marked": [40]},
    )
    assert found == [
        "namespace txo-sw",
        "namespace txo-kafka-1",
        "link txo-x",
        "/etc/netns/txo-kafka-1",
        "processes 40 (marked)",
        "processes 11, 12 (txo-kafka-1)",
    ]
    assert leftovers_from("txo-", "", "lo UNKNOWN\n", [], {"marked": []}) == []


names = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)


@given(st.lists(names, max_size=8), st.lists(names, max_size=8))
def test_leftovers_see_every_prefixed_namespace_and_nothing_else(ours: list[str], others: list[str]) -> None:
    listing = "".join(f"txo-{n} (id: 1)\n" for n in ours) + "".join(f"x{n}\n" for n in others)
    assert leftovers_from("txo-", listing, "", [], {}) == [f"namespace txo-{n}" for n in ours]


def test_the_worker_view_mounts_the_distribution_then_hides(tmp_path: Path) -> None:
    (tmp_path / "a dir").mkdir()
    view = View(tmp_path / "pyspark", tmp_path / "spark home", (tmp_path / "a dir", tmp_path / "absent"))
    script = view.script()
    assert script.startswith("set -e; mount --bind -o ro ")
    assert f"'{tmp_path}/spark home'" in script and f"'{tmp_path}/a dir'" in script
    assert "absent" not in script  # nothing to hide there: a mount would fail
    assert script.index("--bind") < script.index("tmpfs") and script.endswith('exec "$@"')


def test_the_lab_servers_accept_the_subnet_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "postgresql.conf").write_text("# initdb\n")
    (data / "pg_hba.conf").write_text("host all all 127.0.0.1/32 scram-sha-256\n")
    cluster = postgres.PgCluster(
        data, tmp_path / "log", tmp_path / "pid", 5432, tmp_path, None, "10.47.45.21", "10.47.45.0/24"
    )
    postgres._write_conf(cluster)
    postgres._write_conf(cluster)  # every start rewrites the block: once, never twice
    hba = (data / "pg_hba.conf").read_text()
    assert hba.count("10.47.45.0/24") == 2 and hba.startswith("host all all 127.0.0.1/32")
    assert "host replication all 10.47.45.0/24 scram-sha-256" in hba
    assert "listen_addresses = '10.47.45.21'" in (data / "postgresql.conf").read_text()
    assert postgres.admin_conninfo(cluster, "pw")["host"] == "10.47.45.21"


def test_multi_host_urls_name_their_hosts() -> None:
    url = multi_host_url("u", "p w", "db", [5432, 5432], hosts=["pg-1", "pg-2"])
    assert (
        url
        == "postgresql+psycopg://u:p%20w@/db?host=pg-1:5432&host=pg-2:5432&target_session_attrs=read-write"
    )
    assert multi_host_url("u", "p", "db", [6000]) == "postgresql+psycopg://u:p@127.0.0.1:6000/db"


def test_dev_up_lab_is_the_lab_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``txn-offsets dev up|down|status --lab`` runs the lab's own command (make lab-up's), on --lab-dir."""
    from txn_offsets.cli.main import main
    from txn_offsets.devstack.lab import __main__ as lab_command

    calls: list[tuple[str, Path]] = []

    def run(action: str, where: Path) -> int:
        calls.append((action, where))
        return 3

    monkeypatch.setattr(lab_command, "run", run)
    assert main(["dev", "status", "--lab", "--lab-dir", str(tmp_path)]) == 3
    assert main(["dev", "up", "--lab"]) == 3
    assert calls == [("status", tmp_path), ("up", Path(".lab"))]
