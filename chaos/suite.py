"""Run a set of scenarios with a seed and a message budget, and fold their results into a Report."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from chaos.report import Report, ScenarioResult
from chaos.scenarios import (
    SCENARIOS,
    Context,
    Services,
    lab,
    lab_hosts,  # noqa: F401  (registers L7, L8)
    lab_modes,  # noqa: F401  (registers L5, L6)
)

__all__ = ["FULL", "LAB", "LAB_MESSAGES", "SMOKE", "budget", "run_suite"]

logger = logging.getLogger(__name__)

# F12-F14 came last: run after the others, they leave the seeded names and choices (topic names,
# fault decisions, kill points) of F1-F11 what they were, so the figures in docs/reliability.md
# stay reproducible
# F15-F17 (a PostgreSQL failover, each on a primary+replica pair of its own) after those, likewise;
# F18 (low-latency mode: a driver and a task worker killed) last
# F3, F12, F12b, F13, F15, F16 and F18 are in the full suite only: their faults are also integration
# tests in make test (test_lost_commit, test_failover_errors: a backend terminated during COMMIT;
# test_no_silent_exits: a re-created topic and a frozen claim holder; test_recreated_in_flight;
# test_replica: a promotion, a switchover, commits lost or in flight; test_low_latency: a
# long-running task that fails and is retried from the table)
SMOKE = ("F11", "F2", "F1")
FULL = (
    *("F11", "F9", "F7", "F10", "F2", "F5", "F6", "F8", "F3", "F4", "F1", "F14", "F12", "F12b", "F13"),
    *("F15", "F16", "F17", "F18"),
    "F1b",  # F1 at 1,024 partitions (full suite only: tens of seconds per restart)
    "F19",  # many jobs in shared rounds, the driver killed (full suite only)
)
# the lab's scenarios (python -m chaos --lab, make chaos-lab): never with the others (another cluster)
LAB = lab.LAB
LAB_MESSAGES = 80_000  # 10,000 per lab scenario

# share of the message budget per scenario; F1 (the driver kills) gets what is left
_SHARE = {
    "F2": 0.05,
    "F3": 0.05,
    "F4": 0.05,
    "F5": 0.03,
    "F6": 0.03,
    "F7": 0.01,
    "F8": 0.02,
    "F9": 0.01,
    "F10": 0.002,
    "F11": 0.001,
    "F12": 0.01,
    "F12b": 0.01,
    "F13": 0.03,
    "F14": 0.005,
    "F15": 0.01,
    "F16": 0.01,
    "F17": 0.01,
    "F18": 0.02,
    "F1b": 0.05,
    "F19": 0.04,
    **dict.fromkeys(LAB, 1 / len(LAB)),
}
# make test's smoke runs 20,000 messages: F2 keeps 2,500 of them (its five fault points do not
# depend on it: F2 forces one range per point, whatever the seed and the data; every fault costs a
# Python worker's restart, so more data only drew more of the same faults), F1 the rest
_SMOKE_SHARE = {
    "F2": 0.125,
    "F11": 0.01,
}


def budget(names: Sequence[str], messages: int) -> dict[str, int]:
    """Messages per scenario, in the order of `names` (the run order): fixed shares with a
    floor, the rest to F1."""
    share = _SMOKE_SHARE if set(names) <= set(SMOKE) else _SHARE
    out = {n: max(2_000, int(messages * share.get(n, 0.05))) for n in names if n != "F1"}
    rest = max(10_000, messages - sum(out.values()))
    return {n: rest if n == "F1" else out[n] for n in names}


def run_suite(
    services: Services,
    *,
    seed: int,
    names: Sequence[str],
    messages: int,
    kills: int,
    work_dir: Path,
    keep: bool = False,
    drawn_faults: bool = True,
) -> Report:
    report = Report(seed=seed)
    ctx = Context(services, seed, work_dir, keep=keep, drawn_faults=drawn_faults)
    try:
        for name, n in budget(names, messages).items():
            t0 = time.monotonic()
            logger.info("chaos: %s with %d messages", name, n)
            try:
                result = SCENARIOS[name](ctx, n, kills)
            except Exception as exc:  # a harness error is a failed scenario, never a pass
                logger.exception("chaos: %s crashed", name)
                result = ScenarioResult(name)
                result.fail(f"{name} crashed: {type(exc).__name__}: {exc}")
            result.seconds = time.monotonic() - t0
            report.scenarios.append(result)
            logger.info("%s", result.line())
    finally:
        ctx.cleanup()
    return report
