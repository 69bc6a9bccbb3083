"""The lab's leader kills in the job's other modes: low-latency mode (L5) and the Structured Streaming
adapter (L6), each following a replication-3 topic whose partitions' leader is killed -9 mid-follow.

Both reuse L1's machinery (:func:`chaos.scenarios.lab.run_with_fault`): half the records before the
job starts, the other half from a transactional producer while the broker leading every partition
of the topic is killed, then restarted once its partitions moved; the job follows throughout (its
readers move to the new leader), catches up, and the run is checked as every scenario is (lost=0
duplicated=0, stored offsets = the log's ends, lineage chains) with its recovery time.
"""

from __future__ import annotations

from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, scenario
from chaos.scenarios.lab import (
    JobMode,
    Producing,
    broker_host,
    kill_broker,
    leaders,
    leading_broker,
    restart_killed,
    run_with_fault,
)
from txn_offsets.devstack.lab import Lab

__all__ = ["LOW_LATENCY", "STREAM"]

EPOCH_S = 20.0
#: low-latency mode: epochs of 20 s of long-running tasks (commit_max_records: the job's 1,000)
LOW_LATENCY = JobMode(args=("--low-latency", str(EPOCH_S)), name="low-latency")
#: the stream adapter: open_stream + a 0.5 s processing-time trigger (chaos.scenarios.lab_stream)
STREAM = JobMode(module="chaos.scenarios.lab_stream", name="stream")


def _leader_killed(ctx: Context, name: str, messages: int, mode: JobMode) -> ScenarioResult:
    def the_leader(lab: Lab, topic: str, _p: Producing) -> str:
        return broker_host(lab, leading_broker(leaders(ctx, topic)))

    fault = kill_broker(the_leader)
    leader = 1 + ctx.rng.randrange(3)
    restore = restart_killed(ctx, fault)
    result = run_with_fault(ctx, name, messages, leader=leader, fault=fault, restore=restore, mode=mode)
    result.notes.append(f"mode={mode.name}")
    return result


@scenario("L5")
def l5_low_latency_leader_killed(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    return _leader_killed(ctx, "L5", messages, LOW_LATENCY)


@scenario("L6")
def l6_stream_leader_killed(ctx: Context, messages: int, _kills: int) -> ScenarioResult:
    return _leader_killed(ctx, "L6", messages, STREAM)
