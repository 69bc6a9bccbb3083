"""The Prometheus collector: one snapshot of the store per scrape, as metric families.

Two sets of names:

* kafka_exporter's, so dashboards and autoscaling rules built on it work unchanged, with the job
  as the consumer group: ``kafka_consumergroup_current_offset`` / ``kafka_consumergroup_lag``
  ``{consumergroup, topic, partition}``, ``kafka_consumergroup_lag_sum{consumergroup, topic}``,
  ``kafka_topic_partition_current_offset`` / ``kafka_topic_partition_oldest_offset``
  ``{topic, partition}``. The "current offset" of a partition is the end offset at the readers'
  isolation level (the LSO under read_committed), the one the lag is counted against.
* our own, ``txn_offsets_*`` with ``{job, topic, partition}`` or ``{job}`` labels.

A database that cannot be read gives ``txn_offsets_up{target="database"} 0`` and no other series
(the exporter convention: the scrape itself succeeds); Kafka trouble drops only the Kafka series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from txn_offsets.service.snapshot import Snapshot
from txn_offsets.store.schema import STAT_OUTCOMES

__all__ = ["StoreCollector"]

_PART = ["job", "topic", "partition"]
_GROUP = ["consumergroup", "topic", "partition"]


class StoreCollector(Collector):
    """Collects a fresh :class:`Snapshot` (from `read`) on every scrape."""

    def __init__(self, read: Callable[[], Snapshot], refreshes: Callable[[], int] = lambda: 0) -> None:
        self._read = read
        self._refreshes = refreshes

    def describe(self) -> list[Metric]:
        return []  # the series depend on the store's contents: no eager collection at registration

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        snap = self._read()
        up = GaugeMetricFamily("txn_offsets_up", "1 if the service could read the target", labels=["target"])
        up.add_metric(["database"], 0.0 if snap.database_error else 1.0)
        kafka_ok = snap.kafka is None or snap.kafka.error is None
        up.add_metric(["kafka"], 1.0 if kafka_ok else 0.0)
        yield up
        if snap.database_error is None:
            yield from self._jobs(snap)
            yield from self._partitions(snap)
            yield from self._stats(snap)
        if snap.kafka is not None and snap.kafka.fetched_at:
            age = GaugeMetricFamily(
                "txn_offsets_kafka_facts_age_seconds", "Age of the cached Kafka offsets and timestamps"
            )
            age.add_metric([], max(0.0, time.time() - snap.kafka.fetched_at))
            yield age
        yield CounterMetricFamily(
            "txn_offsets_service_kafka_refreshes",
            "Kafka round trips made by this service (cached between scrapes)",
            value=self._refreshes(),
        )
        yield GaugeMetricFamily(
            "txn_offsets_scrape_duration_seconds",
            "Time this scrape spent reading the store and Kafka",
            value=time.monotonic() - started,
        )

    @staticmethod
    def _jobs(snap: Snapshot) -> Iterator[Metric]:
        gen = GaugeMetricFamily("txn_offsets_job_generation", "Fencing generation of the job", labels=["job"])
        live = GaugeMetricFamily("txn_offsets_job_live", "1 while a run holds a live lease", labels=["job"])
        beat = GaugeMetricFamily(
            "txn_offsets_job_heartbeat_age_seconds", "Seconds since the run's last heartbeat", labels=["job"]
        )
        for j in snap.jobs:
            gen.add_metric([j.job], j.generation)
            live.add_metric([j.job], 1.0 if j.live else 0.0)
            if j.heartbeat_age_s is not None:
                beat.add_metric([j.job], j.heartbeat_age_s)
        yield from (gen, live, beat)

    @staticmethod
    def _partitions(snap: Snapshot) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: list[str] = _PART) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        stored = gauge("txn_offsets_stored_offset", "Next offset the job reads (the offsets table)")
        age = gauge("txn_offsets_last_commit_age_seconds", "Seconds since the stored offset last moved")
        end = gauge("txn_offsets_end_offset", "End offset at the readers' isolation level (the LSO)")
        start = gauge("txn_offsets_log_start_offset", "First offset Kafka still has")
        lag = gauge("txn_offsets_lag_records", "Offsets between the stored offset and the end offset")
        lag_s = gauge("txn_offsets_lag_seconds", "Age of the oldest unprocessed record (0 when caught up)")
        lost = gauge("txn_offsets_lost_offsets", "Offsets deleted by Kafka before the job processed them")
        g_cur = gauge(
            "kafka_consumergroup_current_offset",
            "Current Offset of a ConsumerGroup at Topic/Partition",
            _GROUP,
        )
        g_lag = gauge(
            "kafka_consumergroup_lag", "Current Approximate Lag of a ConsumerGroup at Topic/Partition", _GROUP
        )
        g_sum = gauge(
            "kafka_consumergroup_lag_sum",
            "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
            ["consumergroup", "topic"],
        )
        t_cur = gauge(
            "kafka_topic_partition_current_offset",
            "Current Offset of a Broker at Topic/Partition",
            ["topic", "partition"],
        )
        t_old = gauge(
            "kafka_topic_partition_oldest_offset",
            "Oldest Offset of a Broker at Topic/Partition",
            ["topic", "partition"],
        )
        topic_marks: dict[tuple[str, int], tuple[int, int]] = {}
        for j in snap.jobs:
            for (topic, part), row in sorted(j.stored.items()):
                stored.add_metric([j.job, topic, str(part)], row.offset)
                age.add_metric([j.job, topic, str(part)], row.last_commit_age_s)
                g_cur.add_metric([j.job, topic, str(part)], row.offset)
            sums: dict[str, int] = {}
            for p in j.partitions:
                labels = [j.job, p.topic, str(p.partition)]
                end.add_metric(labels, p.end)
                start.add_metric(labels, p.log_start)
                lag.add_metric(labels, p.lag)
                lost.add_metric(labels, p.lost)
                if p.lag_seconds is not None:
                    lag_s.add_metric(labels, p.lag_seconds)
                g_lag.add_metric(labels, p.lag)
                sums[p.topic] = sums.get(p.topic, 0) + p.lag
                topic_marks[(p.topic, p.partition)] = (p.log_start, p.end)
            for topic, total in sorted(sums.items()):
                g_sum.add_metric([j.job, topic], total)
        for (topic, part), (lo, hi) in sorted(topic_marks.items()):
            t_cur.add_metric([topic, str(part)], hi)
            t_old.add_metric([topic, str(part)], lo)
        yield from (stored, age, end, start, lag, lag_s, lost, g_cur, g_lag, g_sum, t_cur, t_old)

    @staticmethod
    def _stats(snap: Snapshot) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            "txn_offsets_batch_duration_seconds", "Duration of the job's batches", labels=["job"]
        )
        outcomes = CounterMetricFamily(
            "txn_offsets_batch_outcomes",
            "Ranges committed / already committed, and batches ended by a conflict, fencing, a "
            "rejected record, data loss or a failed mirror",
            labels=["job", "outcome"],
        )
        for j in snap.jobs:
            if j.stats is None:
                continue
            hist.add_metric(
                [j.job], [(le, float(n)) for le, n in j.stats.cumulative_buckets()], j.stats.batch_seconds_sum
            )
            for name in STAT_OUTCOMES:
                outcomes.add_metric([j.job, name], j.stats.outcomes.get(name, 0))
        yield from (hist, outcomes)
