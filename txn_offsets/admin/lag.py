"""Lag of a job: stored offsets against Kafka's end offsets and record timestamps. Reads only.

The end offset is asked at the readers' isolation level (the LSO under read_committed), as the
planner does. Lag in seconds is the age of the oldest record not yet processed: now minus the
timestamp of the first record at the stored offset (0 when caught up), the measure kafka-lag-exporter
and Burrow report as time lag. :func:`partition_lags` is the pure part, shared with ``txn-offsets
serve``; :func:`offset_lag` is the one-shot query behind ``txn-offsets offsets lag``.

A stored offset outside the log (below the log start: deleted before it was processed; past the
end: after a forced reset, or another topic incarnation) has status ``OUT_OF_LOG``, never lag 0:
the next run of the job finds data loss there (DataLoss, or an audited skip).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from txn_offsets.config import KafkaSettings
from txn_offsets.kafka import metadata
from txn_offsets.kafka.timestamps import first_timestamps
from txn_offsets.ranges import TopicPartition
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, validate_job

__all__ = ["LagReport", "PartitionLag", "offset_lag", "partition_lags"]


@dataclass(frozen=True)
class PartitionLag:
    """One partition's lag: the offsets between the stored position and the end offset."""

    topic: str
    partition: int
    offset: int | None  # None: no row yet (a partition added to a topic the job reads)
    log_start: int
    end: int  # the LSO under read_committed, the high watermark under read_uncommitted
    # age of the oldest unprocessed record; 0 when caught up, None when not known (no timestamps
    # asked, or only aborted records and markers left before the end)
    lag_seconds: float | None = None

    @property
    def position(self) -> int:
        """Where the job reads next (a partition without a row starts at its log start)."""
        return self.log_start if self.offset is None else self.offset

    @property
    def lag(self) -> int:
        """Offsets left to process; an upper bound on records (markers, aborted records and
        compaction leave gaps). A partition without a row starts at the log start, as planned."""
        return max(0, self.end - self.position)

    @property
    def out_of_log(self) -> bool:
        """The stored offset is not a position in the log: below its start or past its end."""
        return self.offset is not None and not self.log_start <= self.offset <= self.end

    @property
    def status(self) -> str:
        return "OUT_OF_LOG" if self.out_of_log else "OK"

    @property
    def lost(self) -> int:
        """Offsets deleted from Kafka before they were processed (the next plan: DataLoss or a skip)."""
        return 0 if self.offset is None else max(0, self.log_start - self.offset)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lag": self.lag, "lost": self.lost, "status": self.status}


@dataclass(frozen=True)
class LagReport:
    job: str
    isolation_level: str
    partitions: tuple[PartitionLag, ...]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def out_of_log(self) -> int:
        """Partitions whose stored offset is outside the log."""
        return sum(p.out_of_log for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float | None:
        known = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(known) if known else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "isolation_level": self.isolation_level,
            "total_lag": self.total,
            "max_lag_seconds": self.max_lag_seconds,
            "out_of_log": self.out_of_log,
            "partitions": [p.as_dict() for p in self.partitions],
        }


def partition_lags(
    stored: Mapping[TopicPartition, int],
    partitions: Mapping[str, tuple[int, ...]],
    marks: Mapping[TopicPartition, tuple[int, int]],
    timestamps: Mapping[TopicPartition, int | None] | None = None,
    *,
    now_s: float | None = None,
) -> tuple[PartitionLag, ...]:
    """The rows of every stored partition plus those Kafka has for the stored topics (`partitions`),
    for which `marks` ((log start, end) per partition) has an answer. Pure: no I/O."""
    now = time.time() if now_s is None else now_s
    keys = set(stored)
    for topic in {t for t, _ in stored}:
        keys.update((topic, p) for p in partitions.get(topic, ()))
    rows = []
    first_ts = (timestamps or {}).get
    for key in sorted(k for k in keys if k in marks):
        start, end = marks[key]
        offset = stored.get(key)
        seconds: float | None = 0.0
        if end > (start if offset is None else offset):  # PartitionLag.lag > 0, one object a row
            ts = first_ts(key)
            seconds = None if ts is None else max(0.0, now - ts / 1000.0)
        rows.append(PartitionLag(key[0], key[1], offset, start, end, seconds))
    return tuple(rows)


def offset_lag(
    store: Store,
    job: str,
    kafka: KafkaSettings,
    *,
    timeout_s: float = 10.0,
    seconds: bool = True,
) -> LagReport:
    """Per partition of `job`: stored offset, end offset, lag in offsets and (`seconds`) in seconds.

    Covers every partition with a stored offset plus partitions added since to the topics the job
    reads (the planner seeds those at the log start). Reads only.
    """
    validate_job(job)
    with store.connect() as conn:
        lock_job(conn, store.settings, job, for_update=False)  # UnknownJob rather than an empty report
        stored = offset_rows.load_offsets(conn, store.settings, job)
    parts = {
        topic: tuple(metadata.partitions_for(kafka, topic, timeout_s=timeout_s))
        for topic in sorted({t for t, _ in stored})
    }
    keys = set(stored) | {(t, p) for t, ps in parts.items() for p in ps}
    marks = metadata.watermarks(kafka, keys, timeout_s=timeout_s) if keys else {}
    ts: dict[TopicPartition, int | None] = {}
    if seconds:
        # below the log start (lost to retention) the oldest record left is the first one
        at = {k: max(stored.get(k, marks[k][0]), marks[k][0]) for k in keys}
        lagging = {k: off for k, off in at.items() if off < marks[k][1]}
        ts = first_timestamps(kafka, lagging, timeout_s=timeout_s)
    return LagReport(job, kafka.isolation_level, partition_lags(stored, parts, marks, ts))
