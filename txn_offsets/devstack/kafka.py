"""An Apache Kafka node (KRaft: broker + controller) assembled from Maven Central and run on the JVM.

The stack runs one on loopback; the lab (:mod:`txn_offsets.devstack.lab`) three, each on its own
address, as one static quorum (`KafkaNode.voters`, one cluster id). The jars are resolved once with
Maven into ``~/.cache/txn-offsets/kafka-<version>/libs`` (the Maven repository itself is cached
beside it), so later starts need no network.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from txn_offsets._java import find_java
from txn_offsets.devstack._proc import adopt, pid_alive, port_free, read_pid, require_port_free, stop_pid
from txn_offsets.errors import JavaNotFound, StackError

logger = logging.getLogger(__name__)

SERVICE = "kafka"
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.txn-offsets</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka
        level: WARN
      - name: org.apache.kafka
        level: WARN
      - name: kafka.server.KafkaRaftServer
        level: INFO
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


@dataclass(frozen=True)
class KafkaNode:
    """Files and ports of one broker (+ controller)."""

    home: Path  # <stack>/kafka
    libs: Path
    port: int
    controller_port: int
    extra_config: tuple[str, ...] = ()  # key=value lines replacing or adding to ours (the stack's TLS)
    host: str = "127.0.0.1"  # the address it listens on and advertises
    node_id: int = 1
    # controller.quorum.voters of a static multi-node quorum ("1@h1:9093,2@h2:9093,..."); empty: a
    # single node that formats itself as its own quorum (--standalone)
    voters: str = ""
    cluster_id: str | None = None  # the same on every node of a quorum; None: a fresh one
    jvm_options: tuple[str, ...] = ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC")

    @property
    def pid_file(self) -> Path:
        return self.home.parent / "kafka.pid"

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.home / "kafka.log"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "txn-offsets"


def java_binary() -> str:
    """The `java` to run Kafka with (>= 17), as a stack error with its fix."""
    try:
        return find_java()
    except JavaNotFound as exc:
        raise StackError(
            "java", exc.problem, "install openjdk-17 (or newer) and/or set JAVA_HOME to it"
        ) from None


def ensure_libs() -> Path:
    """Resolve Kafka and its runtime dependencies from Maven Central into the cache (once)."""
    libs = cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"
    done_marker = libs.parent / ".complete"
    if done_marker.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            SERVICE,
            "Maven (mvn) is needed once to download Kafka's jars from Maven Central",
            "install it (Debian: `apt-get install maven`)",
        )
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    logger.info("downloading Kafka %s from Maven Central into %s", KAFKA_VERSION, libs)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pom.xml").write_text(_POM.format(kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
        done = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                f"-Dmaven.repo.local={cache_dir() / 'm2'}",
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    if done.returncode != 0:
        out = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
        errors = [line.removeprefix("[ERROR]").strip() for line in out.splitlines() if "[ERROR]" in line]
        detail = next((e for e in errors if e), out.strip()[-300:])[:400]
        network = re.search(
            r"Could not transfer|transfer failed|UnknownHost|Connect(ion)? (refused|timed out)", out
        )
        problem = "Maven Central is unreachable" if network else "Maven could not assemble Kafka"
        raise StackError(
            SERVICE,
            f"{problem}: {detail}",
            "check network access to Maven Central (or a mirror in ~/.m2/settings.xml), then run "
            "`make stack-up` again",
        )
    if not list(libs.glob("kafka_2.13-*.jar")):
        raise StackError(SERVICE, f"Maven finished but no kafka jar is in {libs}", f"remove {libs.parent}")
    done_marker.touch()
    return libs


def config_lines(node: KafkaNode) -> list[str]:
    """The node's server.properties, line by line: ours, with `extra_config` replacing or adding."""
    lines = [
        "process.roles=broker,controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={node.voters}"
        if node.voters
        else f"controller.quorum.bootstrap.servers={node.host}:{node.controller_port}",
        f"listeners=PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
        f"advertised.listeners=PLAINTEXT://{node.host}:{node.port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={node.data_dir}",
        "num.partitions=1",
        # one node: every internal topic must have replication 1, or transactions and groups hang
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "log.retention.check.interval.ms=5000",
        "log.segment.delete.delay.ms=1000",
        "log.cleaner.backoff.ms=1000",
        # the controller's no-op record every 500 ms (KIP-835's default) is a metadata-log append,
        # replay and loader pass each: a third of an idle broker's CPU on a 2-core machine
        "metadata.max.idle.interval.ms=5000",
    ]
    extra = dict(line.split("=", 1) for line in node.extra_config)
    lines = [f"{k}={extra.pop(k)}" if k in extra else line for line in lines for k in [line.split("=", 1)[0]]]
    return lines + [f"{k}={v}" for k, v in extra.items()]


def _render_config(node: KafkaNode) -> None:
    node.home.mkdir(parents=True, exist_ok=True)
    node.config.write_text("\n".join([*config_lines(node), ""]))
    (node.home / "log4j2.yaml").write_text(_LOG4J2)


def _java_cmd(
    java: str, node: KafkaNode, main: str, *args: str, jvm_options: tuple[str, ...] | None = None
) -> list[str]:
    return [
        java,
        *(node.jvm_options if jvm_options is None else jvm_options),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={node.home / 'log4j2.yaml'}",
        "-cp",
        f"{node.libs}/*",
        main,
        *args,
    ]


def _java_failure(output: str) -> str:
    """A failed Kafka tool's reason: the first exception line (its message: what to fix), then the
    end of the output."""
    lines = output.strip().splitlines()
    first = next((line for line in lines if "Exception" in line or "Error" in line), "")
    tail = output.strip()[-300:]
    return f"{first.strip()[:300]} ... {tail}" if first and first.strip() not in tail else tail


def _format_storage(java: str, node: KafkaNode) -> None:
    if (node.data_dir / "meta.properties").exists():
        return
    cluster_id = node.cluster_id or kafka_uuid()
    done = subprocess.run(
        _java_cmd(
            java,
            node,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            f"--config={node.config}",
            *([] if node.voters else ["--standalone"]),  # a static quorum's voters are in the config
            jvm_options=("-Xms256m", "-Xmx256m", "-XX:+UseG1GC"),
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    if done.returncode != 0:
        raise StackError(
            SERVICE,
            f"formatting the KRaft storage failed: {_java_failure(done.stdout + done.stderr)}",
            f"remove {node.data_dir} and run `make stack-up` again",
        )


def kafka_uuid() -> str:
    """A fresh Kafka cluster id: 16 random bytes in url-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def start(node: KafkaNode) -> None:
    """Format storage (first time), start the broker and wait for a produce/consume round trip."""
    pid = read_pid(node.pid_file, SERVICE, str(node.config))
    if pid is None:
        pid = launch(node)
    wait_ready(node, pid)


def launch(node: KafkaNode) -> int:
    """Render the config, format storage (first time) and start the node without waiting for it
    (a quorum's nodes must all be started before any is ready); returns its pid. It listens in the
    calling thread's network namespace (the lab's hosts: :mod:`txn_offsets.devstack.lab.spawn`)."""
    java = java_binary()
    port_setting = "TXN_OFFSETS_KAFKA_PORT (or remove .stack/ports.json)"
    require_port_free(SERVICE, node.port, port_setting, node.host)
    require_port_free(SERVICE, node.controller_port, "TXN_OFFSETS_KAFKA_CONTROLLER_PORT", node.host)
    _render_config(node)
    _format_storage(java, node)
    with node.log_file.open("ab") as log:
        proc = subprocess.Popen(
            _java_cmd(java, node, "kafka.Kafka", str(node.config)),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the shell that ran `make stack-up`
            cwd=node.home,
        )
    adopt(proc)
    node.pid_file.write_text(f"{proc.pid}\n")
    logger.info("kafka starting (pid %d, %s)", proc.pid, node.bootstrap)
    return proc.pid


def wait_ready(node: KafkaNode, pid: int, timeout_s: float = 120) -> None:
    """Wait until a real produce -> consume round trip through the broker succeeds."""
    from txn_offsets.devstack.readiness import kafka_round_trip

    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            tail = node.log_file.read_text(errors="replace")[-1500:] if node.log_file.exists() else ""
            node.pid_file.unlink(missing_ok=True)
            raise StackError(SERVICE, f"the broker exited during start-up:\n{tail}", f"read {node.log_file}")
        if port_free(node.port, node.host):  # not listening yet: probing now would only log connection errors
            time.sleep(0.5)
            continue
        try:
            kafka_round_trip(node.bootstrap, timeout_s=min(20.0, max(1.0, deadline - time.monotonic())))
            return
        except Exception as exc:
            last = str(exc)
            time.sleep(1)
    raise StackError(SERVICE, f"not ready after {timeout_s:.0f}s: {last}", f"read {node.log_file}")


def stop(node: KafkaNode) -> bool:
    """Stop the broker we started (by pid); True if something was stopped."""
    pid = read_pid(node.pid_file, SERVICE, str(node.config))
    if pid is None:
        return False
    stop_pid(pid, timeout_s=45)
    node.pid_file.unlink(missing_ok=True)
    logger.info("kafka stopped (pid %d)", pid)
    return True
