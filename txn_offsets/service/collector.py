"""The Prometheus collector: one snapshot of the store per scrape, as metric families.

No label is named ``job``: Prometheus sets that one on every series it scrapes (the scrape job), so
a ``job`` of ours would be renamed ``exported_job`` and ``max by (job)`` would merge every txn_offsets
job into one series. Two sets of names:

* kafka_exporter's, so dashboards (e.g. Grafana 7589) and autoscaling rules built on it work
  unchanged, each job being a consumer group: its mirror group where the service knows one
  (``groups``), else the job's name. ``kafka_consumergroup_current_offset`` /
  ``kafka_consumergroup_lag`` ``{consumergroup, topic, partition}``,
  ``kafka_consumergroup_lag_sum{consumergroup, topic}``, ``kafka_topic_partitions{topic}``,
  ``kafka_topic_partition_current_offset`` / ``kafka_topic_partition_oldest_offset``
  ``{topic, partition}``. The "current offset" of a partition is the end offset at the readers'
  isolation level (the LSO under read_committed), the one the lag is counted against.
  ``kafka_consumergroup_lag_sum`` is the one name ``promtool check metrics`` rejects (a gauge
  ending in ``_sum``): it stays for those dashboards; ``txn_offsets_topic_lag_records`` is the
  compliant one beside it.
* our own, ``txn_offsets_*`` with ``{txn_job, topic, partition}``, ``{txn_job, topic}`` or
  ``{txn_job}`` labels, all passing ``promtool check metrics``; among them the job's status
  (:mod:`~txn_offsets.service.status`) as ``txn_offsets_job_status{txn_job, status}``, 1 for the
  current state and 0 for the others.

A retired job (``jobs retire``, not started since) gives no series: retired with lag it would read
as STOPPED with lag and page through the shipped rules; ``txn_offsets_jobs_retired`` counts them.

A database that cannot be read gives ``txn_offsets_up{target="database"} 0`` and no other series
(the exporter convention: the scrape itself succeeds); Kafka trouble drops only the Kafka series.
A topic Kafka answers about without facts (unknown, a name it refuses, no leader) costs only the
series of that topic: ``txn_offsets_topic_readable{txn_job, topic}`` is 0 for it (1 for the others)
while ``txn_offsets_up{target="kafka"}`` stays 1 and every other topic's lag is shown.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from txn_offsets.service.snapshot import JobView, Snapshot
from txn_offsets.service.status import STATES, JobStatuses
from txn_offsets.store.schema import STAT_OUTCOMES

__all__ = ["JOB_LABEL", "StoreCollector"]

JOB_LABEL = "txn_job"  # never "job": Prometheus' own target label
_PART = [JOB_LABEL, "topic", "partition"]
_GROUP = ["consumergroup", "topic", "partition"]


def _gauge(name: str, doc: str, labels: list[str] = _PART) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StoreCollector(Collector):
    """Collects a fresh :class:`Snapshot` (from `read`) on every scrape."""

    def __init__(
        self,
        read: Callable[[], Snapshot],
        refreshes: Callable[[], int] = lambda: 0,
        *,
        statuses: JobStatuses | None = None,
        groups: Mapping[str, str] | None = None,
    ) -> None:
        self._read = read
        self._refreshes = refreshes
        self._statuses = statuses or JobStatuses()
        self._groups = dict(groups or {})

    def describe(self) -> list[Metric]:
        return []  # the series depend on the store's contents: no eager collection at registration

    def group_of(self, job: str) -> str:
        """The consumer group a job is shown as: its mirror group if configured, else its name."""
        return self._groups.get(job, job)

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        snap = self._read()
        up = GaugeMetricFamily("txn_offsets_up", "1 if the service could read the target", labels=["target"])
        up.add_metric(["database"], 0.0 if snap.database_error else 1.0)
        kafka_ok = snap.kafka is None or snap.kafka.error is None
        up.add_metric(["kafka"], 1.0 if kafka_ok else 0.0)
        yield up
        if snap.database_error is None:
            yield GaugeMetricFamily(
                "txn_offsets_jobs_retired",
                "Jobs retired by `jobs retire` (and not started since): they give no other series",
                value=len(snap.retired),
            )
            yield from self._jobs(snap, self._statuses.observe(snap))
            yield from self._partitions(snap)
            yield from self._consumer_groups(snap)
            yield from self._stats(snap)
            yield from _store_families(snap)
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
    def _jobs(snap: Snapshot, statuses: Mapping[str, str]) -> Iterator[Metric]:
        one = [JOB_LABEL]
        gen = _gauge("txn_offsets_job_generation", "Fencing generation of the job", one)
        live = _gauge("txn_offsets_job_live", "1 while a run holds a live lease", one)
        beat = _gauge("txn_offsets_job_heartbeat_age_seconds", "Seconds since the run's last heartbeat", one)
        lag = _gauge(
            "txn_offsets_job_lag_records", "Offsets left to process over all partitions of the job", one
        )
        lag_s = _gauge(
            "txn_offsets_job_lag_seconds",
            "Age of the job's oldest unprocessed record, from the record timestamps at the stored "
            "offsets (0 when caught up)",
            one,
        )
        status = _gauge(
            "txn_offsets_job_status",
            "1 for the job's status (OK, LAGGING, STALLED, FENCED, STOPPED, OUT_OF_LOG), 0 for the others",
            [JOB_LABEL, "status"],
        )
        for j in snap.jobs:
            gen.add_metric([j.job], j.generation)
            live.add_metric([j.job], 1.0 if j.live else 0.0)
            if j.heartbeat_age_s is not None:
                beat.add_metric([j.job], j.heartbeat_age_s)
            if j.partitions:
                lag.add_metric([j.job], j.total_lag)
            seconds = [p.lag_seconds for p in j.partitions if p.lag_seconds is not None]
            if seconds:
                lag_s.add_metric([j.job], max(seconds))
            current = statuses.get(j.job)
            if current is not None:
                for state in STATES:
                    status.add_metric([j.job, state], 1.0 if state == current else 0.0)
        yield from (gen, live, beat, lag, lag_s, status)

    @staticmethod
    def _partitions(snap: Snapshot) -> Iterator[Metric]:
        stored = _gauge("txn_offsets_stored_offset", "Next offset the job reads (the offsets table)")
        age = _gauge("txn_offsets_last_commit_age_seconds", "Seconds since the stored offset last moved")
        end = _gauge("txn_offsets_end_offset", "End offset at the readers' isolation level (the LSO)")
        start = _gauge("txn_offsets_log_start_offset", "First offset Kafka still has")
        lag = _gauge("txn_offsets_lag_records", "Offsets between the stored offset and the end offset")
        lag_s = _gauge("txn_offsets_lag_seconds", "Age of the oldest unprocessed record (0 when caught up)")
        lost = _gauge("txn_offsets_lost_offsets", "Offsets deleted by Kafka before the job processed them")
        out_of_log = _gauge(
            "txn_offsets_offset_out_of_log",
            "1 when the stored offset is outside the log (not lag 0: the next run finds data loss there)",
        )
        topic_lag = _gauge(
            "txn_offsets_topic_lag_records",
            "Offsets left to process over all partitions of the topic",
            [JOB_LABEL, "topic"],
        )
        readable = _gauge(
            "txn_offsets_topic_readable",
            "1 when Kafka gave the offsets of the job's topic, 0 when it answered without them (no "
            "such topic, a name it refuses, no leader): /offsets says why",
            [JOB_LABEL, "topic"],
        )
        kafka_ok = snap.kafka is not None and snap.kafka.error is None
        for j in snap.jobs:
            for (topic, part), row in sorted(j.stored.items()):
                stored.add_metric([j.job, topic, str(part)], row.offset)
                age.add_metric([j.job, topic, str(part)], row.last_commit_age_s)
            for p in j.partitions:
                labels = [j.job, p.topic, str(p.partition)]
                end.add_metric(labels, p.end)
                start.add_metric(labels, p.log_start)
                lag.add_metric(labels, p.lag)
                lost.add_metric(labels, p.lost)
                out_of_log.add_metric(labels, 1.0 if p.out_of_log else 0.0)
                if p.lag_seconds is not None:
                    lag_s.add_metric(labels, p.lag_seconds)
            for topic, total in sorted(_topic_lags(j).items()):
                topic_lag.add_metric([j.job, topic], total)
            if kafka_ok:  # while Kafka answers at all: else txn_offsets_up says it for every topic
                for topic in j.topics:
                    readable.add_metric([j.job, topic], 0.0 if topic in j.topic_errors else 1.0)
        yield from (stored, age, end, start, lag, lag_s, lost, out_of_log, topic_lag, readable)

    def _consumer_groups(self, snap: Snapshot) -> Iterator[Metric]:
        """kafka_exporter's families (its names, help texts and labels)."""
        g_cur = _gauge(
            "kafka_consumergroup_current_offset",
            "Current Offset of a ConsumerGroup at Topic/Partition",
            _GROUP,
        )
        g_lag = _gauge(
            "kafka_consumergroup_lag", "Current Approximate Lag of a ConsumerGroup at Topic/Partition", _GROUP
        )
        g_sum = _gauge(
            "kafka_consumergroup_lag_sum",
            "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
            ["consumergroup", "topic"],
        )
        t_parts = _gauge("kafka_topic_partitions", "Number of partitions for this Topic", ["topic"])
        t_cur = _gauge(
            "kafka_topic_partition_current_offset",
            "Current Offset of a Broker at Topic/Partition",
            ["topic", "partition"],
        )
        t_old = _gauge(
            "kafka_topic_partition_oldest_offset",
            "Oldest Offset of a Broker at Topic/Partition",
            ["topic", "partition"],
        )
        topic_marks: dict[tuple[str, int], tuple[int, int]] = {}
        for j in snap.jobs:
            group = self.group_of(j.job)
            for (topic, part), row in sorted(j.stored.items()):
                g_cur.add_metric([group, topic, str(part)], row.offset)
            for p in j.partitions:
                g_lag.add_metric([group, p.topic, str(p.partition)], p.lag)
                topic_marks[(p.topic, p.partition)] = (p.log_start, p.end)
            for topic, total in sorted(_topic_lags(j).items()):
                g_sum.add_metric([group, topic], total)
        if snap.kafka is not None and snap.kafka.error is None:
            for topic, parts in sorted(snap.kafka.partitions.items()):
                t_parts.add_metric([topic], len(parts))
        for (topic, part), (lo, hi) in sorted(topic_marks.items()):
            t_cur.add_metric([topic, str(part)], hi)
            t_old.add_metric([topic, str(part)], lo)
        yield from (g_cur, g_lag, g_sum, t_parts, t_cur, t_old)

    @staticmethod
    def _stats(snap: Snapshot) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            "txn_offsets_batch_duration_seconds", "Duration of the job's batches", labels=[JOB_LABEL]
        )
        outcomes = CounterMetricFamily(
            "txn_offsets_batch_outcomes",
            "Ranges committed / already committed, and batches ended by a conflict, fencing, a "
            "rejected record, data loss or a failed mirror",
            labels=[JOB_LABEL, "outcome"],
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


def _store_families(snap: Snapshot) -> Iterator[Metric]:
    """The offsets table's HOT-update counters, ratio and size; the oldest open transaction."""
    if snap.store is None:
        return
    table = snap.store.offsets
    yield CounterMetricFamily(
        "txn_offsets_offsets_table_updates",
        "Row updates of the offsets table since the statistics were reset (pg_stat_user_tables.n_tup_upd)",
        value=table.updates,
    )
    yield CounterMetricFamily(
        "txn_offsets_offsets_table_hot_updates",
        "Heap-only (HOT) row updates of the offsets table: no index entry, pruned in place (n_tup_hot_upd)",
        value=table.hot_updates,
    )
    yield GaugeMetricFamily(
        "txn_offsets_offsets_table_hot_update_ratio",
        "HOT updates / all updates of the offsets table since the statistics were reset (NaN before any)",
        value=math.nan if table.hot_ratio is None else table.hot_ratio,
    )
    yield GaugeMetricFamily(
        "txn_offsets_offsets_table_bytes",
        "Size of the offsets table's heap (pg_relation_size)",
        value=table.size_bytes,
    )
    yield GaugeMetricFamily(
        "txn_offsets_offsets_table_dead_rows",
        "Dead row versions in the offsets table (n_dead_tup)",
        value=table.dead_rows,
    )
    yield GaugeMetricFamily(
        "txn_offsets_oldest_transaction_age_seconds",
        "Age of the oldest transaction open in the database (pg_stat_activity.xact_start); while it stays "
        "open no row version younger than it is pruned or vacuumed",
        value=snap.store.oldest_transaction_s,
    )


def _topic_lags(j: JobView) -> dict[str, int]:
    sums: dict[str, int] = {}
    for p in j.partitions:
        sums[p.topic] = sums.get(p.topic, 0) + p.lag
    return sums
