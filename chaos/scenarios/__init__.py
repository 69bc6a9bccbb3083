"""The chaos scenarios, one module per fault family; importing this package registers F1..F19, F1b.

Each scenario sets up fresh topics and a fresh schema, runs the real job, breaks it, and returns a
:class:`~chaos.report.ScenarioResult` checked against the Kafka log. The families: processes
(F1, F2, F5, F6, F13), services (F3, F4), data (F7-F10, F12), a topic re-created in flight (F12b),
bad_config (F11), user_code (F14), a PostgreSQL failover (F15-F17), low-latency mode (F18), scale (F1b:
F1 at 1,024 partitions; F19: many jobs in shared rounds).
"""

import re

from chaos.scenarios import (
    bad_config,
    data,
    failover,
    inflight,
    lowlatency,
    processes,
    scale,
    services,
    user_code,
)
from chaos.scenarios.context import SCENARIOS, Context, Services, new_job_id, scenario


def _number(name: str) -> tuple[int, str]:
    """F12b -> (12, "b"): the registry in scenario order, a variant after its scenario."""
    found = re.fullmatch(r"F(\d+)([a-z]*)", name)
    if found is None:
        raise ValueError(f"scenario name {name!r} is not F<number>[<letter>]")
    return int(found.group(1)), found.group(2)


# the families register in import order: list the registry F1..F19 and F1b
_by_number = sorted(SCENARIOS.items(), key=lambda item: _number(item[0]))
SCENARIOS.clear()
SCENARIOS.update(_by_number)

__all__ = [
    "SCENARIOS",
    "Context",
    "Services",
    "bad_config",
    "data",
    "failover",
    "inflight",
    "lowlatency",
    "new_job_id",
    "processes",
    "scale",
    "scenario",
    "services",
    "user_code",
]
