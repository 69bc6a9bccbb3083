"""The pure parts of the service: lag rows, histogram buckets, and the collector's families and
labels (kafka_exporter's names) on a hand-made snapshot, parsed with prometheus-client's parser."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txn_offsets.cli.lag import partition_lags
from txn_offsets.service.collector import StoreCollector
from txn_offsets.service.kafka_view import KafkaFacts
from txn_offsets.service.snapshot import JobView, Snapshot, StoredRow
from txn_offsets.store.schema import BATCH_SECONDS_BUCKETS, STAT_OUTCOMES
from txn_offsets.store.stats import JobStats, bucket_index


@given(st.floats(min_value=0, max_value=10_000, allow_nan=False))
def test_bucket_index_is_the_first_bound_not_below(seconds: float) -> None:
    i = bucket_index(seconds)
    bounds = [*BATCH_SECONDS_BUCKETS, float("inf")]
    assert seconds <= bounds[i] and (i == 0 or bounds[i - 1] < seconds)


@given(
    st.integers(0, 100),
    st.integers(0, 100),
    st.integers(0, 100),
    st.one_of(st.none(), st.integers(0, 10**12)),
    st.booleans(),
)
def test_partition_lags(start: int, span: int, stored: int, ts: int | None, has_row: bool) -> None:
    end = start + span
    rows = partition_lags(
        {("t", 0): stored} if has_row else {("t", 1): 0},
        {"t": (0, 1)},
        {("t", 0): (start, end), ("t", 1): (0, 0)},
        {("t", 0): ts},
        now_s=10**9,
    )
    (row,) = [r for r in rows if r.partition == 0]
    position = stored if has_row else start
    assert row.offset == (stored if has_row else None)
    assert row.lag == max(0, end - position)
    assert row.lost == (max(0, start - stored) if has_row else 0)
    if row.lag == 0:
        assert row.lag_seconds == 0.0
    elif ts is None:
        assert row.lag_seconds is None
    else:
        assert row.lag_seconds == max(0.0, 10**9 - ts / 1000)


def test_collector_families_and_labels() -> None:
    stats = JobStats("j", 3, 4.5, (1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0), {"committed": 9, "fenced": 1})
    lags = partition_lags({("t", 0): 5, ("t", 1): 2}, {"t": (0, 1)}, {("t", 0): (0, 8), ("t", 1): (0, 2)}, {})
    view = JobView(
        "j", 4, "run-1", True, 1.5, {("t", 0): StoredRow(5, 2.0), ("t", 1): StoredRow(2, 9.0)}, lags, stats
    )
    facts = KafkaFacts(frozenset({"t"}), fetched_at=1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: Snapshot((view,), None, facts), lambda: 7))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    group = (("consumergroup", "j"), ("partition", "0"), ("topic", "t"))
    assert samples[("kafka_consumergroup_current_offset", group)] == 5
    assert samples[("kafka_consumergroup_lag", group)] == 3
    assert samples[("kafka_consumergroup_lag_sum", (("consumergroup", "j"), ("topic", "t")))] == 3
    assert samples[("kafka_topic_partition_current_offset", (("partition", "0"), ("topic", "t")))] == 8
    assert samples[("kafka_topic_partition_oldest_offset", (("partition", "1"), ("topic", "t")))] == 0
    assert samples[("txn_offsets_lag_records", (("job", "j"), ("partition", "0"), ("topic", "t")))] == 3
    assert (
        samples[("txn_offsets_last_commit_age_seconds", (("job", "j"), ("partition", "1"), ("topic", "t")))]
        == 9
    )
    assert samples[("txn_offsets_job_generation", (("job", "j"),))] == 4
    assert samples[("txn_offsets_batch_duration_seconds_count", (("job", "j"),))] == 3
    assert samples[("txn_offsets_batch_duration_seconds_bucket", (("job", "j"), ("le", "1.0")))] == 2
    assert samples[("txn_offsets_batch_duration_seconds_bucket", (("job", "j"), ("le", "+Inf")))] == 3
    for outcome in STAT_OUTCOMES:
        key = ("txn_offsets_batch_outcomes_total", (("job", "j"), ("outcome", outcome)))
        assert samples[key] == {"committed": 9, "fenced": 1}.get(outcome, 0)
    assert samples[("txn_offsets_service_kafka_refreshes_total", ())] == 7


def test_database_down_gives_up_zero_and_nothing_else() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: Snapshot(database_error="cannot reach PostgreSQL")))
    names = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert names == {
        "txn_offsets_up",
        "txn_offsets_service_kafka_refreshes",
        "txn_offsets_scrape_duration_seconds",
    }
