"""What a run reports: one line per committed batch (``on_batch``) and the run's summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from txn_offsets.spark.tasks import TaskReport

__all__ = ["BatchReport", "JobSummary"]

# TaskReports a summary keeps (the most recent): a job that runs for days must not grow
KEPT_OUTCOMES = 10_000


@dataclass(frozen=True)
class BatchReport:
    """One committed batch, as passed to ``on_batch`` (progress displays, metrics)."""

    job: str
    number: int
    ranges: int
    records: int
    committed: int
    already_committed: int
    seconds: float
    lag: int


@dataclass
class JobSummary:
    """What a run did."""

    job: str
    generation: int
    batches: int = 0
    records: int = 0
    committed: int = 0
    already_committed: int = 0
    seconds: float = 0.0
    stopped_by: str = ""
    max_connections: int = 0  # the run's connection budget (store.budget): at most this many open
    outcomes: list[TaskReport] = field(default_factory=list, repr=False)  # the last 10,000

    def add(self, report: BatchReport, outcomes: Sequence[TaskReport]) -> None:
        """Count a committed batch (or epoch) and keep its ranges' outcomes (the last KEPT_OUTCOMES)."""
        self.batches = report.number
        self.records += report.records
        self.committed += report.committed
        self.already_committed += report.already_committed
        self.outcomes.extend(outcomes)
        del self.outcomes[:-KEPT_OUTCOMES]
