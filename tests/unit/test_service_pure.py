"""The pure parts of the service: lag rows, histogram buckets, the collector's families and
labels (kafka_exporter's names) on a hand-made snapshot, parsed with prometheus-client's parser,
the health monitor's states with checks of our own, and which hosts need a token."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txn_offsets.admin.lag import partition_lags
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, ServiceUnavailable
from txn_offsets.redaction import Secret
from txn_offsets.service.app import is_loopback
from txn_offsets.service.collector import StoreCollector
from txn_offsets.service.health import HealthMonitor
from txn_offsets.service.kafka_view import KafkaFacts
from txn_offsets.service.server import check_exposure
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
    assert samples[("txn_offsets_lag_records", (("partition", "0"), ("topic", "t"), ("txn_job", "j")))] == 3
    assert (
        samples[
            ("txn_offsets_last_commit_age_seconds", (("partition", "1"), ("topic", "t"), ("txn_job", "j")))
        ]
        == 9
    )
    assert samples[("txn_offsets_job_generation", (("txn_job", "j"),))] == 4
    assert samples[("txn_offsets_batch_duration_seconds_count", (("txn_job", "j"),))] == 3
    assert samples[("txn_offsets_batch_duration_seconds_bucket", (("le", "1.0"), ("txn_job", "j")))] == 2
    assert samples[("txn_offsets_batch_duration_seconds_bucket", (("le", "+Inf"), ("txn_job", "j")))] == 3
    for outcome in STAT_OUTCOMES:
        key = ("txn_offsets_batch_outcomes_total", (("outcome", outcome), ("txn_job", "j")))
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


def monitor(postgres: Callable[[], str | None], kafka: Callable[[], str | None]) -> HealthMonitor:
    return HealthMonitor(
        DatabaseSettings(Secret("postgresql+psycopg://u:pw@db.example:5432/d")),
        KafkaSettings("k1.example:9092"),
        interval_s=0.05,
        wedged_after_s=0.0,  # at least 2 x stale_after_s (0.3 s)
        checks={"postgres": postgres, "kafka": kafka},
        expected_revision="0005",
    )


def wait_for(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not what():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_health_states_from_the_checks() -> None:
    revision = ["0005"]
    kafka_fails = threading.Event()

    def kafka() -> None:
        if kafka_fails.is_set():
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    health = monitor(lambda: revision[0], kafka)
    assert health.probe("live") == (
        503,
        {"status": "unavailable", "postgres": "unavailable", "kafka": "unavailable"},
    )
    assert health.kafka_down() is None  # not checked yet: a scrape may still ask Kafka
    health.start()
    try:
        wait_for(health.checked)
        assert health.probe("ready") == (
            200,
            {"status": "ok", "postgres": "ok", "kafka": "ok", "schema": "ok"},
        )
        revision[0] = "0003"
        wait_for(lambda: health.probe("ready")[1]["schema"] == "mismatch")
        assert health.probe("ready")[0] == 503
        kafka_fails.set()
        wait_for(lambda: health.kafka_down() is not None)
        assert health.kafka_down() == "KafkaException(_TRANSPORT)"
        status, body = health.probe("live", details=True)
        assert status == 200 and (body["status"], body["postgres"], body["kafka"]) == (
            "ok",
            "ok",
            "unavailable",
        )
        details = body["details"]
        assert isinstance(details, dict)
        assert details["postgres"]["url"] == "postgresql+psycopg://u:***@db.example:5432/d"
        assert (details["postgres"]["revision"], details["postgres"]["expected_revision"]) == ("0003", "0005")
        assert details["kafka"]["bootstrap"] == "k1.example:9092"
        assert details["kafka"]["error"] == "KafkaException(_TRANSPORT)"
        assert details["kafka"]["ok_age_s"] >= details["kafka"]["checked_age_s"] >= 0
        assert "pw" not in str(health.probe("ready", details=True))
    finally:
        health.stop()
    assert health.probe("live")[0] == 503  # stopped: not alive


def test_a_failed_kafka_check_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """Our error's detail (the cause librdkafka gave) in the log line and for the scrapes; only the
    class in the probe's details."""

    def kafka() -> None:
        raise ServiceUnavailable("Kafka", "k1.example:9092", "connection refused by k1.example:9092")

    health = monitor(lambda: "0005", kafka)
    health.start()
    try:
        wait_for(lambda: health.kafka_down() is not None)
        assert health.kafka_down() == "connection refused by k1.example:9092"
        details = health.probe("ready", details=True)[1]["details"]
        assert isinstance(details, dict) and details["kafka"]["error"] == "ServiceUnavailable"
    finally:
        health.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "txn_offsets.service.health"]
    assert said == ["health: kafka unavailable (connection refused by k1.example:9092)"]


def test_a_stuck_check_goes_stale_then_fails_liveness() -> None:
    release = threading.Event()
    calls = [0]

    def postgres() -> str:
        calls[0] += 1
        if calls[0] > 1:
            release.wait(10)  # the second check hangs (a database that stopped answering)
        return "0005"

    health = monitor(postgres, lambda: None)
    health.start()
    try:
        wait_for(lambda: health.probe("ready")[0] == 200)
        started = time.monotonic()
        wait_for(lambda: health.probe("ready")[1]["postgres"] == "unavailable")
        assert time.monotonic() - started < 1.0  # stale after 3 intervals (0.15 s)
        assert health.probe("live")[1]["kafka"] == "ok"  # the other dependency is not held up
        wait_for(lambda: health.probe("live")[0] == 503)  # no check finished for wedged_after_s
        release.set()
        wait_for(lambda: health.probe("live")[0] == 200)
    finally:
        release.set()
        health.stop()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),  # noqa: S104 - the address under test
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("my-host.example", False),
        ("localhost.example", False),
    ],
)
def test_which_hosts_need_a_token(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    check_exposure(host, Secret("x" * 16))  # a token: any host
    check_exposure(host, None, insecure_no_token=True)  # the risk accepted explicitly
    if loopback:
        check_exposure(host, None)
    else:
        with pytest.raises(ConfigError, match="--insecure-no-token") as err:
            check_exposure(host, None)
        assert err.value.setting == "--host" and "TXN_OFFSETS_SERVE_TOKEN" in str(err.value)
