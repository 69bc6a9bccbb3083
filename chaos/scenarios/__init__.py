"""The chaos scenarios, one module per fault family; importing this package registers F1..F11.

Each scenario sets up fresh topics and a fresh schema, runs the real job, breaks it, and returns a
:class:`~chaos.report.ScenarioResult` checked against the Kafka log.
"""

from chaos.scenarios import bad_config, data, processes, services
from chaos.scenarios.context import SCENARIOS, Context, Services, new_job_id, scenario

__all__ = [
    "SCENARIOS",
    "Context",
    "Services",
    "bad_config",
    "data",
    "new_job_id",
    "processes",
    "scenario",
    "services",
]
