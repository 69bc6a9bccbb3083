"""Scale faults: F1b, F1's driver kills on a topic of 1,024 partitions (issue 24).

Every batch is about a thousand ranges, so a kill lands with hundreds of claims in flight, some
committed and some not, spread over the Spark tasks: each restart must plan from exactly what was
committed (I1-I3 after every kill, lost=0 duplicated=0 at the end). Full suite only: a run at 1,024
partitions takes tens of seconds per restart, more than the smoke's budget in ``make test``.
"""

from __future__ import annotations

from chaos.report import ScenarioResult
from chaos.scenarios.context import Context, scenario
from chaos.scenarios.processes import driver_kills

PARTITIONS = 1_024
KILLS = 3  # at most: each restart is a new JVM and ~1,000 ranges per batch


@scenario("F1b")
def f1b_driver_kills_many_partitions(ctx: Context, messages: int, kills: int) -> ScenarioResult:
    """kill -9 of the driver at F1's seeded points on 1,024 partitions, each followed by a restart."""
    # a few records per partition per batch: several batches of ~1,000 ranges per run
    return driver_kills(
        ctx,
        "F1b",
        messages,
        min(kills, KILLS),
        parts=PARTITIONS,
        min_per_partition=5,
        first_batch_s=240.0,
        # the page views are skewed (a partition holds up to ~15 % of the records): a small cap
        # would take hundreds of batches to catch up, so the final run reads it all at once
        final_per_partition=messages,
    )
