"""Three Kafka nodes on the lab's kafka hosts: one static KRaft quorum, replication 3.

Each node is broker and controller (combined mode), formatted with the same cluster id, its voters
in its config (no ``--standalone``). The settings a production cluster has and the single-node
stack cannot: replication 3 with min.insync.replicas 2 and no unclean leader election, the
transaction state log and the group offsets replicated the same way, an ISR that shrinks in 10 s.
Small heaps: three JVMs share two cores with everything else. Never take two of the three down at
once: that is no quorum (metadata freezes, transactions time out).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from txn_offsets.devstack import kafka
from txn_offsets.devstack._proc import pid_alive
from txn_offsets.devstack.lab import quorum
from txn_offsets.devstack.lab.net import Network
from txn_offsets.devstack.lab.spawn import entered
from txn_offsets.errors import StackError

__all__ = ["PORT", "READY_TOPIC", "bootstrap", "launch", "nodes", "wait_ready"]

SERVICE = "kafka"
PORT = 9092
CONTROLLER_PORT = 9093
READY_TOPIC = "_txn_offsets_lab_ready"

#: what every lab node adds to (or replaces in) the devstack's single-node server.properties
SETTINGS = (
    "default.replication.factor=3",
    "min.insync.replicas=2",
    "unclean.leader.election.enable=false",
    "offsets.topic.replication.factor=3",
    "offsets.topic.num.partitions=8",
    "transaction.state.log.replication.factor=3",
    "transaction.state.log.min.isr=2",
    "transaction.state.log.num.partitions=8",  # the default 50 is 150 replicas for nothing here
    "share.coordinator.state.topic.replication.factor=3",
    "share.coordinator.state.topic.min.isr=2",
    "replica.lag.time.max.ms=10000",  # the ISR shrinks in 10 s, not 30 s
)
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx320m",
    "-XX:+UseG1GC",
    "-XX:MaxMetaspaceSize=128m",
    "-XX:+ExitOnOutOfMemoryError",
)


def nodes(net: Network, run_dir: Path, libs: Path, cluster_id: str) -> list[kafka.KafkaNode]:
    """One node per kafka host (node.id 1..3 in host order), files under ``run_dir/<host>``."""
    hosts = [h for h in net.hosts if h.role == "kafka"]
    voters = ",".join(f"{i}@{h.address}:{CONTROLLER_PORT}" for i, h in enumerate(hosts, 1))
    return [
        kafka.KafkaNode(
            home=run_dir / h.name / "kafka",
            libs=libs,
            port=PORT,
            controller_port=CONTROLLER_PORT,
            extra_config=SETTINGS,
            host=h.address,
            node_id=i,
            voters=voters,
            cluster_id=cluster_id,
            jvm_options=JVM_OPTIONS,
        )
        for i, h in enumerate(hosts, 1)
    ]


def host_of(net: Network, node: kafka.KafkaNode) -> str:
    return next(h.name for h in net.hosts if h.address == node.host)


def bootstrap(net: Network, *, by_name: bool = True) -> str:
    """``kafka-1:9092,kafka-2:9092,kafka-3:9092`` (the names every lab host resolves), or by address."""
    return ",".join(f"{h.name if by_name else h.address}:{PORT}" for h in net.hosts if h.role == "kafka")


def launch(net: Network, nodes_: list[kafka.KafkaNode]) -> dict[str, int]:
    """Format and start every node, each in its host's namespace, side by side (a quorum is ready
    only once a majority runs); host name -> pid."""

    def one(node: kafka.KafkaNode) -> tuple[str, int]:
        name = host_of(net, node)
        with entered(net, name):
            return name, kafka.launch(node)

    with ThreadPoolExecutor(len(nodes_)) as pool:
        return dict(pool.map(one, nodes_))


def wait_ready(
    net: Network, nodes_: list[kafka.KafkaNode], pids: dict[str, int], timeout_s: float = 240
) -> None:
    """From the driver host: every broker registered with the quorum's active controller, a probe
    topic (replication 3) whose every partition has all three in its ISR, and every voter of the
    KRaft quorum caught up with its leader (:mod:`.quorum`)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        for node in nodes_:
            name = host_of(net, node)
            if not pid_alive(pids[name]):
                tail = node.log_file.read_text(errors="replace")[-1500:] if node.log_file.exists() else ""
                raise StackError(SERVICE, f"{name} exited during start-up:\n{tail}", f"read {node.log_file}")
        with entered(net, "driver"):
            try:
                last = _probe(bootstrap(net, by_name=False), len(nodes_))
                if not last:
                    voters = [(n.host, CONTROLLER_PORT) for n in nodes_]
                    last = quorum.lagging(quorum.describe(voters), len(nodes_), int(time.time() * 1000))
            except Exception as exc:  # not up yet: any client error is "try again"
                last = f"{type(exc).__name__}: {exc}"
        if not last:
            return
        time.sleep(1)
    raise StackError(
        SERVICE,
        f"the {len(nodes_)} nodes are not ready after {timeout_s:.0f}s: {last}",
        f"read {', '.join(str(n.log_file) for n in nodes_)}",
    )


def _probe(servers: str, count: int) -> str:
    """'' when the cluster is ready, else what is missing."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": servers, "socket.timeout.ms": 5000, "log_level": 2})
    meta = admin.list_topics(timeout=5)
    if len(meta.brokers) < count or meta.controller_id < 0:
        return f"brokers {sorted(meta.brokers)} registered, controller {meta.controller_id}"
    if READY_TOPIC not in meta.topics:
        future = admin.create_topics([NewTopic(READY_TOPIC, num_partitions=1, replication_factor=count)])
        try:
            future[READY_TOPIC].result(timeout=10)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        return "probe topic created"
    partitions = meta.topics[READY_TOPIC].partitions.values()
    short = [f"partition {p.id} isr {sorted(p.isrs)}" for p in partitions if len(p.isrs) < count]
    return "; ".join(short)
