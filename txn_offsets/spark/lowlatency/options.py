"""The low-latency mode's settings: :class:`LowLatency`, given to ``run_job(..., low_latency=...)``."""

from __future__ import annotations

from dataclasses import dataclass

from txn_offsets.errors import ConfigError

__all__ = ["LowLatency"]


def _positive(name: str, value: object, *, whole: bool = False) -> None:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        kind = "a positive whole number" if whole else "a positive number"
        raise ConfigError(name, f"must be {kind}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LowLatency:
    """Run the job in epochs of long-running Spark tasks that commit small ranges continuously.

    * ``epoch_s`` - how long one epoch (one Spark job of long-running tasks) runs before the driver
      plans the next from the table. An epoch ends earlier when the driver sees a new partition or
      a changed topic, when the run is fenced (a newer run or a reset), or on stop.
    * ``commit_interval_ms`` - a partition's range commits once its first record has waited this
      long and the consumer has nothing more buffered; ``commit_max_records`` - or as soon as it
      holds that many records (the cap while catching up on a backlog). Every commit is the batch
      mode's guarded claim + write + advance in one transaction.
    * ``check_interval_ms`` - how often each task reads the job row (its generation, run and
      lease) to learn that the epoch was ended or the run fenced.
    * ``fetch_wait_ms`` - Kafka's ``fetch.wait.max.ms`` for the followers (the broker holds a fetch
      at the log's end that long); the ``fetch.wait.max.ms`` of the Kafka settings wins.
    * ``tasks`` - long-running tasks per epoch (None: one per core of the session, and never more
      than the partitions). Each holds a task slot for the whole epoch.
    * ``mirror_every_s`` - with ``mirror_group``, how often the driver mirrors the table's offsets.
    """

    epoch_s: float = 60.0
    commit_interval_ms: float = 10.0
    commit_max_records: int = 5000
    check_interval_ms: float = 250.0
    fetch_wait_ms: int = 5
    tasks: int | None = None
    mirror_every_s: float = 1.0

    def __post_init__(self) -> None:
        _positive("epoch_s", self.epoch_s)
        _positive("commit_interval_ms", self.commit_interval_ms)
        _positive("commit_max_records", self.commit_max_records, whole=True)
        _positive("check_interval_ms", self.check_interval_ms)
        _positive("mirror_every_s", self.mirror_every_s)
        if self.tasks is not None:
            _positive("tasks", self.tasks, whole=True)
        if (
            isinstance(self.fetch_wait_ms, bool)
            or not isinstance(self.fetch_wait_ms, int)
            or self.fetch_wait_ms < 0
        ):
            raise ConfigError("fetch_wait_ms", f"must be a whole number >= 0, got {self.fetch_wait_ms!r}")
        if self.check_interval_ms / 1000 >= self.epoch_s:
            raise ConfigError(
                "check_interval_ms",
                f"{self.check_interval_ms}ms is not shorter than epoch_s ({self.epoch_s}s): tasks would "
                f"not see the epoch end in time",
            )
