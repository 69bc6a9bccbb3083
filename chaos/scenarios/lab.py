"""The lab's chaos scenarios (``python -m chaos --lab``): brokers killed, hosts killed or cut off, on the
production-shaped lab (docs/operations.md#the-lab), each with the usual invariants and its recovery time.

The harness runs on the driver host (``python -m chaos --lab`` re-runs itself there), the job's
driver too, its tasks on the two worker hosts from the packed job environment
(:mod:`chaos.scenarios.lab_job`). Topics have replication 3. Each scenario breaks one thing while the
job runs and a transactional producer keeps producing (committed and aborted transactions), restores
it, lets the job catch up and checks the run against the Kafka log. Its recovery time is the fault ->
the first commit after it: the earliest ``committed_at`` of the job's lineage rows (``commits``)
later than the fault's wall-clock time (PostgreSQL's ``now()`` of the committing transaction, the
same machine clock). Printed beside it: when every partition had committed again after the fault
(the latest of their first commits after it) and when the producer ended its next transaction.

- L1: kill -9 of the broker leading every partition of the job's topic, while a batch reads.
- L2: kill -9 of the broker that is the producer's transaction coordinator (the leader of the
  ``__transaction_state`` partition of its transactional id), transactions open; the job's
  partitions are led by another broker, so the fault moves the coordinator only.
- L3: a worker host killed (every process, no FIN/RST) while a batch runs.
- L4: one broker isolated from the other brokers and the workers for 30 s, then healed (its ISR
  shrinks and grows).

L5 and L6 (:mod:`chaos.scenarios.lab_modes`: L1 in low-latency mode and as a Structured Streaming
query), L7 and L8 (:mod:`chaos.scenarios.lab_hosts`: a worker host cut inside its PostgreSQL
transaction, a zombie driver across hosts) reuse this module's machinery.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import threading
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import sqlalchemy as sa
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from chaos.procs import REPO, JobProcess
from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, expect_ok, new_job_id, producer_matches, scenario
from chaos.scenarios.lab_job import VARIABLE
from examples import pageviews
from txn_offsets.devstack import kafka
from txn_offsets.devstack.lab import Lab, faults, kafka3, spark
from txn_offsets.devstack.lab.spawn import entered, hidden_paths

__all__ = ["LAB", "coordinator_partition", "every_partition_s", "leading_broker", "recovery_s"]

logger = logging.getLogger(__name__)

#: every lab scenario, in run order (L5, L6: chaos.scenarios.lab_modes; L7, L8: chaos.scenarios.lab_hosts;
#: chaos.suite imports both, which registers them)
LAB = ("L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8")
PARTITIONS = 3
TXN_PARTITIONS = 8  # transaction.state.log.num.partitions (kafka3.SETTINGS)
JOB_TIMEOUT_S = 600.0
CUT_S = 30.0
PACE_S = 0.4  # between two of the producer's transactions (of 250 records; every 4th aborted)


# --- pure logic (tests/lab/test_lab_chaos_logic.py) ------------------------------------------------
def recovery_s(fault_at: float, committed: Sequence[dt.datetime]) -> float | None:
    """Seconds from the fault (wall clock, epoch seconds) to the first commit after it; None if none."""
    after = [c.timestamp() - fault_at for c in committed if c.timestamp() > fault_at]
    return min(after) if after else None


def every_partition_s(fault_at: float, committed: Sequence[tuple[int, dt.datetime]]) -> float | None:
    """Seconds from the fault until every partition that committed after it had done so once: the
    latest of the partitions' first commits after the fault (rows: partition, committed_at)."""
    first: dict[int, float] = {}
    for part, at in committed:
        if at.timestamp() > fault_at:
            first[part] = min(first.get(part, at.timestamp()), at.timestamp())
    return max(first.values()) - fault_at if first else None


def leading_broker(leaders: Mapping[int, int]) -> int:
    """The broker leading the most partitions (partition -> leader id); ties: the lowest id."""
    counts = collections.Counter(leaders.values())
    return min(counts, key=lambda b: (-counts[b], b))


def coordinator_partition(transactional_id: str, partitions: int = TXN_PARTITIONS) -> int:
    """The ``__transaction_state`` partition of a transactional id: Kafka's
    ``Utils.abs(transactionalId.hashCode) % partitions`` (Java's String.hashCode over UTF-16 units)."""
    h = 0
    units = transactional_id.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


# --- the lab, from the driver host -------------------------------------------------------------
def the_lab() -> Lab:
    where = os.environ.get("LAB_DIR")
    if not where:
        raise RuntimeError("LAB_DIR is not set: run the lab scenarios with python -m chaos --lab")
    return Lab(Path(where))


def broker_host(lab: Lab, node_id: int) -> str:
    return [h.name for h in lab.net.hosts if h.role == "kafka"][node_id - 1]


def broker_id(lab: Lab, host: str) -> int:
    return [h.name for h in lab.net.hosts if h.role == "kafka"].index(host) + 1


def leaders(ctx: Context, topic: str) -> dict[int, int]:
    parts = ctx.admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {p: m.leader for p, m in parts.items()}


def isr_sizes(ctx: Context, topic: str) -> list[int]:
    parts = ctx.admin.list_topics(topic, timeout=10).topics[topic].partitions
    return sorted(len(m.isrs) for m in parts.values())


def lab_topic(ctx: Context, partitions: int, leader: int) -> str:
    """A fresh replication-3 topic whose every partition `leader` leads (preferred replica)."""
    name = ctx.name("lab").replace("_", "-")
    others = [b for b in (1, 2, 3) if b != leader]
    assignment = [[leader, *(others if p % 2 else others[::-1])] for p in range(partitions)]
    ctx.admin.create_topics([NewTopic(name, num_partitions=partitions, replica_assignment=assignment)])[
        name
    ].result(timeout=60)
    ctx.topics.append(name)
    ctx.partitions[name] = partitions
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if set(leaders(ctx, name).values()) == {leader} and isr_sizes(ctx, name) == [3] * partitions:
                return name
        time.sleep(0.5)
    raise TimeoutError(f"topic {name}: no leader {leader} with a full ISR after 60 s")


def restart_broker(lab: Lab, host: str, ctx: Context, topic: str, timeout_s: float = 180) -> float:
    """Start the killed broker on `host` again; seconds until the topic's ISR holds all three."""
    started = time.monotonic()
    node = next(n for n in kafka3.nodes(lab.net, lab.run_dir, kafka.ensure_libs(), "-")
                if kafka3.host_of(lab.net, n) == host)  # fmt: skip
    with entered(lab.net, host):
        kafka.launch(node)  # formatted already: its data and cluster id stay
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(Exception):
            if isr_sizes(ctx, topic) == [3] * ctx.partitions[topic]:
                return time.monotonic() - started
        time.sleep(1)
    raise TimeoutError(f"{host}: the ISR of {topic} is not full {timeout_s:.0f} s after its restart")


def _daemons(lab: Lab) -> spark.Daemons:
    python = os.environ["LAB_NODE_PYTHON"]
    return spark.Daemons(lab.net, lab.run_dir, python, hidden_paths(python))


class LabJob(JobProcess):
    """The chaos job with its session on the lab's Spark cluster (:mod:`chaos.scenarios.lab_job`)."""

    module = "chaos.scenarios.lab_job"
    prefix: Sequence[str] = ()  # ip netns exec NS: a driver on another host

    def start(self) -> LabJob:
        import subprocess
        import sys

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", self.module, *self.args],
                                         cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        self.started = time.monotonic()
        return self


def spark_settings(lab: Lab, work: Path) -> dict[str, str]:
    """The session's settings: what docs/operations.md's spark-submit command gives, in-process."""
    archive = REPO / "dist" / "job-env.tar.gz"
    if not archive.is_file():
        raise RuntimeError(f"{archive} is missing: run `make job-env`")
    zipped = work / "chaos-lab.zip"  # the writer (chaos.faults) and the decoder
    if not zipped.exists():
        work.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zipped, "w") as zf:
            for name in ("__init__.py", "faults.py", "scenarios/lab_decode.py"):  # what the tasks import
                zf.write(REPO / "chaos" / name, f"chaos/{name}")
            # not the registry of every scenario: the tasks need only the decoder of this package
            zf.writestr("chaos/scenarios/__init__.py", '"""The lab tasks\' view of chaos.scenarios."""\n')
    return {
        "spark.master": spark.master_url(lab.net),
        "spark.archives": f"{archive}#env",
        "spark.submit.pyFiles": str(zipped),
        "spark.driver.host": lab.net.host("driver").address,
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.ui.enabled": "false",
        "spark.python.unix.domain.socket.enabled": "true",
    }


def start_job(
    ctx: Context,
    lab: Lab,
    run_dir: Path,
    *,
    job: str,
    schema: str,
    topic: str,
    mode: JobMode | None = None,
    driver: str = "driver",
) -> LabJob:
    """The lab job of `mode` (default: batch mode) with its driver on host `driver`: from this host
    (the harness's, the driver host) or, for another, by ``ip netns exec`` into it."""
    mode = mode or JobMode()
    address = lab.net.host(driver).address
    extra = ["--follow", "--batch-interval", "0.5", "--master", spark.master_url(lab.net), *mode.args]
    jp = ctx.job(run_dir, job=job, schema=schema, topics=[topic], max_per_partition=1_000, extra=extra)
    settings = spark_settings(lab, ctx.work_dir) | dict(mode.spark) | {"spark.driver.host": address}
    env = {**jp.env, VARIABLE: json.dumps(settings), "SPARK_LOCAL_IP": address}
    proc = LabJob(jp.args, env, jp.log_path)
    proc.module = mode.module
    if driver != "driver":
        proc.prefix = ["ip", "netns", "exec", lab.net.netns(lab.net.host(driver))]
    return proc.start()


@dataclasses.dataclass(frozen=True)
class JobMode:
    """How the lab job runs: its entry module, extra arguments and Spark settings (batch mode: none)."""

    module: str = "chaos.scenarios.lab_job"
    args: tuple[str, ...] = ()
    name: str = "batch"
    spark: tuple[tuple[str, str], ...] = ()


def batches(run_dir: Path) -> int:
    path = run_dir / "batches"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(what: str, ready: Callable[[], bool], jp: JobProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not jp.running():
            raise RuntimeError(f"the job exited waiting for {what}: {jp.log_path}")
        if ready():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")


class Producing(threading.Thread):
    """pageviews.produce in a thread (committed and aborted transactions), with a known
    transactional id (L2 looks up its coordinator)."""

    def __init__(self, ctx: Context, topic: str, messages: int, transactional_id: str | None = None) -> None:
        super().__init__(daemon=True)
        self.args = (ctx.services.kafka_bootstrap, topic, messages)
        self.seed = ctx.rng.getrandbits(32)
        self.transactional_id = transactional_id or f"lab-{ctx.rng.getrandbits(48):012x}"
        self.oracle: pageviews.Oracle | None = None
        self.error: BaseException | None = None
        self.done_at: list[float] = []  # when each transaction ended (committed or aborted)

    def run(self) -> None:
        named = SimpleNamespace(
            uuid4=lambda: SimpleNamespace(hex=self.transactional_id.removeprefix("pageviews-"))
        )
        try:
            with mock.patch.object(pageviews, "uuid", named):
                bootstrap, topic, messages = self.args
                self.oracle = pageviews.produce(
                    bootstrap, topic, messages, partitions=PARTITIONS, per_transaction=250, abort_every=4,
                    seed=self.seed,
                    progress=self._ended,
                )  # fmt: skip
        except BaseException as exc:  # reported by the scenario
            self.error = exc

    def _ended(self, _committed: int) -> None:
        self.done_at.append(time.time())
        time.sleep(PACE_S)  # transactions spread over the fault, not all done before it

    @property
    def full_id(self) -> str:
        return f"pageviews-{self.transactional_id}"


def commit_times(ctx: Context, schema: str, job: str) -> list[tuple[int, dt.datetime]]:
    """(partition, committed_at) of the job's lineage rows."""
    query = sa.text(f'SELECT part, committed_at FROM "{schema}".commits WHERE job = :j')
    with ctx.engine.connect() as conn:
        return [(r[0], r[1]) for r in conn.execute(query, {"j": job})]


def run_with_fault(
    ctx: Context,
    name: str,
    messages: int,
    *,
    leader: int,
    fault: Callable[[Lab, str, Producing], tuple[float, str]],
    restore: Callable[[Lab, str], str],
    transactional_id: str | None = None,
    mode: JobMode | None = None,
) -> ScenarioResult:
    """The shape every lab scenario shares: a topic led by broker `leader`, half the records before
    the job starts, the other half produced while `fault` strikes (it returns its wall-clock time and
    a note); `restore` undoes it (a note); then the job catches up and the run is checked. A job
    that stops on an error is a violation; it is then restarted once (what an operator does) so
    the invariants are still checked at the end."""
    result = ScenarioResult(name)
    lab = the_lab()
    topic = lab_topic(ctx, PARTITIONS, leader)
    schema = ctx.schema()
    job = f"{name.lower()}-{new_job_id()}"
    first = ctx.produce(topic, messages // 2, PARTITIONS)
    run_dir = ctx.work_dir / name / job
    jp = start_job(ctx, lab, run_dir, job=job, schema=schema, topic=topic, mode=mode)
    runs = 1
    try:
        if mode is None:
            wait_until("the first batch", lambda: batches(run_dir) >= 1, jp, 300)
        else:  # a long-running task or a stream's micro-batch: its first commit
            wait_until("the first commit", lambda: sum(ctx.stored(schema, job).values()) > 0, jp, 300)
        producing = Producing(ctx, topic, messages - messages // 2, transactional_id)
        producing.start()
        fault_at, fault_note = fault(lab, topic, producing)
        restore_note = restore(lab, topic)
        producing.join(JOB_TIMEOUT_S)
        if producing.error is not None or producing.oracle is None:
            result.fail(f"the producer failed: {producing.error!r}")
            return result
        log = ctx.log({topic: PARTITIONS})
        ends = dict(log.ends)
        caught_up = ctx.wait_caught_up(jp, schema, job, ends, JOB_TIMEOUT_S)
        if not caught_up and not jp.running():
            stopped = jp.wait(30)
            result.fail(
                f"{name}: the job stopped after the fault: {stopped.last_error() or stopped.returncode}"
            )
            restart_dir = ctx.work_dir / name / f"{job}-restart"
            jp = start_job(ctx, lab, restart_dir, job=job, schema=schema, topic=topic, mode=mode)
            runs += 1
            caught_up = ctx.wait_caught_up(jp, schema, job, ends, JOB_TIMEOUT_S)
        if not caught_up:
            result.fail(f"the job did not catch up to {ends}: {jp.log_path}")
    finally:
        jp.terminate()
        res = jp.wait(120)
    expect_ok(result, res, f"{name} job")
    producer_matches(result, log, first, producing.oracle)
    ctx.check(result, schema=schema, job=job, log=log, final=True, when=name)
    commits = commit_times(ctx, schema, job)
    took = recovery_s(fault_at, [at for _, at in commits])
    recovery = "none" if took is None else f"{took:.1f}s"
    every = every_partition_s(fault_at, commits)
    if took is None:
        result.fail(f"{name}: no commit after the fault")
    after = [t - fault_at for t in producing.done_at if t > fault_at]
    producer = f"{min(after):.1f}s" if after else "none"
    result.runs, result.faults, result.messages = runs, 1, log.records
    result.notes += [
        f"recovery={recovery}",
        f"every partition={'none' if every is None else f'{every:.1f}s'}",
        f"producer's next transaction={producer}",
        fault_note,
        restore_note,
    ]
    return result


def kill_broker(
    host_of: Callable[[Lab, str, Producing], str],
) -> Callable[[Lab, str, Producing], tuple[float, str]]:
    def fault(lab: Lab, topic: str, producing: Producing) -> tuple[float, str]:
        host = host_of(lab, topic, producing)
        time.sleep(1.0)  # transactions open, a batch reading
        at = time.time()
        faults.kill_processes(lab.net, host)
        fault.host = host  # type: ignore[attr-defined]
        return at, f"killed {host}"

    return fault


def restart_killed(ctx: Context, fault: Any) -> Callable[[Lab, str], str]:
    def restore(lab: Lab, topic: str) -> str:
        killed = broker_id(lab, fault.host)
        deadline = time.monotonic() + 30  # the cluster works on two brokers meanwhile
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if killed not in leaders(ctx, topic).values() and max(isr_sizes(ctx, topic)) < 3:
                    break
            time.sleep(1)
        time.sleep(5)
        took = restart_broker(lab, fault.host, ctx, topic)
        return f"ISR full {took:.0f}s after restart"

    return restore


@scenario("L1")
def l1_partition_leader_killed(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    leader = 1 + ctx.rng.randrange(3)

    def the_leader(lab: Lab, topic: str, _p: Producing) -> str:
        return broker_host(lab, leading_broker(leaders(ctx, topic)))

    fault = kill_broker(the_leader)
    return run_with_fault(ctx, "L1", messages, leader=leader, fault=fault, restore=restart_killed(ctx, fault))


@scenario("L2")
def l2_transaction_coordinator_killed(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    tid = f"lab-{ctx.rng.getrandbits(48):012x}"
    meta = ctx.admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
    coordinator = meta.partitions[coordinator_partition(f"pageviews-{tid}")].leader

    def the_coordinator(lab: Lab, _topic: str, producing: Producing) -> str:
        part = coordinator_partition(producing.full_id)
        now = ctx.admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
        return broker_host(lab, now.partitions[part].leader)

    fault = kill_broker(the_coordinator)
    # the job's partitions led by another broker: the kill moves the coordinator, not their leaders
    leader = next(b for b in (1, 2, 3) if b != coordinator)
    return run_with_fault(ctx, "L2", messages, leader=leader, fault=fault, restore=restart_killed(ctx, fault),
                          transactional_id=tid)  # fmt: skip


@scenario("L3")
def l3_worker_host_killed(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    def kill(lab: Lab, _topic: str, _p: Producing) -> tuple[float, str]:
        time.sleep(1.0)
        at = time.time()
        faults.kill_host(lab.net, "worker-2")
        return at, "killed worker-2"

    def back(lab: Lab, _topic: str) -> str:
        time.sleep(15)
        faults.heal(lab.net, "worker-2")
        took = _daemons(lab).restart_worker("worker-2")
        return f"worker-2 registered {took:.0f}s after its restart"

    return run_with_fault(ctx, "L3", messages, leader=1 + ctx.rng.randrange(3), fault=kill, restore=back)


@scenario("L4")
def l4_broker_isolated(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    state: dict[str, Any] = {}

    def isolate(lab: Lab, topic: str, _p: Producing) -> tuple[float, str]:
        host = broker_host(lab, leading_broker(leaders(ctx, topic)))
        others = [h.name for h in lab.net.hosts if h.role in ("kafka", "spark-worker") and h.name != host]
        time.sleep(1.0)
        at = time.time()
        faults.isolate(lab.net, host, others)
        state.update(host=host, others=others, at=time.monotonic())
        return at, f"isolated {host} from {len(others)} hosts"

    def rejoin(lab: Lab, topic: str) -> str:
        shrunk = None
        while time.monotonic() - state["at"] < CUT_S:
            with contextlib.suppress(Exception):
                if shrunk is None and max(isr_sizes(ctx, topic)) < 3:
                    shrunk = time.monotonic() - state["at"]
            time.sleep(1)
        faults.rejoin(lab.net, state["host"], state["others"])
        healed = time.monotonic()
        while time.monotonic() - healed < 120 and isr_sizes(ctx, topic) != [3] * PARTITIONS:
            time.sleep(1)
        grown = time.monotonic() - healed
        when = "never" if shrunk is None else f"{shrunk:.0f}s"
        return f"ISR shrank after {when}, full {grown:.0f}s after healing"

    return run_with_fault(ctx, "L4", messages, leader=1 + ctx.rng.randrange(3), fault=isolate, restore=rejoin)
