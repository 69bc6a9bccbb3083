"""/metrics as a real Prometheus (Debian's 2.42 package) and Grafana take it: no label named `job`,
names that pass `promtool check metrics`, `kafka_topic_partitions`, the Burrow-style job status,
the shipped alert rules (`promtool check rules`, `promtool test rules` with fixture series) and a
live Prometheus scraping `txn-offsets serve` that sees one series per job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.integration.helpers import produce_counts, seed
from tests.unproven import commit_ranges
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.service.app import Service, create_app
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.store import stats
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, end_run, start_run
from txn_offsets.store.schema import tables_for

from . import prometheus_bin

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "txn-offsets.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "txn-offsets.json"
RULES_TEST = Path(__file__).parent / "prometheus" / "rules_test.yml"
COMPAT_EXCEPTION = "kafka_consumergroup_lag_sum"  # kafka_exporter's name; promtool flags its _sum

Labels = dict[str, str]


@pytest.fixture(scope="session")
def prom() -> prometheus_bin.Binaries:
    return prometheus_bin.binaries()


@pytest.fixture
def make_client(
    engine: sa.Engine, migrated: DatabaseSettings, kafka_bootstrap: str
) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(rules: object = None, groups: dict[str, str] | None = None, ttl_s: float = 0.0) -> TestClient:
        view = KafkaView(KafkaSettings(kafka_bootstrap), ttl_s=ttl_s)
        extra: dict[str, object] = {"rules": rules} if rules is not None else {}
        if groups is not None:
            extra["groups"] = groups
        service = Service(Store(sa.create_engine(migrated.url, pool_pre_ping=True), migrated), view, **extra)
        client = TestClient(create_app(service))
        client.service = service  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()
        c.service.close()  # type: ignore[attr-defined]
        c.service.store.engine.dispose()  # type: ignore[attr-defined]


def samples(text: str) -> list[tuple[str, str, Labels, float]]:
    """(family, sample name, labels, value) of every sample."""
    return [
        (f.name, s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def statuses(text: str, job: str) -> dict[str, float]:
    return {
        labels["status"]: value
        for _family, name, labels, value in samples(text)
        if name == "txn_offsets_job_status" and labels.get("txn_job") == job
    }


def status_of(client: TestClient, job: str) -> str:
    from txn_offsets.service.status import STATES

    got = statuses(client.get("/metrics").text, job)
    assert sorted(got) == sorted(STATES), got  # every state, exactly one of them set
    (current,) = [s for s, v in got.items() if v == 1]
    assert sum(got.values()) == 1
    return current


def without_family(text: str, family: str) -> str:
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not re.match(rf"(# (HELP|TYPE) )?{family}(\{{| )", line)
    )


def promtool(prom: prometheus_bin.Binaries, *args: str, stdin: str | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [str(prom.promtool), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_labels_names_and_promtool(
    make_client: Callable[..., TestClient],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    prom: prometheus_bin.Binaries,
) -> None:
    topic = topic_factory(partitions=3)
    produce_counts(kafka_bootstrap, topic, {0: 4, 1: 2, 2: 1})
    jobs = [f"pj-{os.urandom(4).hex()}" for _ in range(2)]
    for job in jobs:
        start_run(store, job)
        seed(engine, migrated, job, {(topic, 0): 1, (topic, 1): 2, (topic, 2): 0})
    stats.record_batch(store, jobs[0], 0.3, {"committed": 3})
    client = make_client(groups={jobs[0]: "mirror-of-a"})
    text = client.get("/metrics").text
    got = samples(text)
    assert not [s for s in got if "job" in s[2] or "exported_job" in s[2]]  # Prometheus' own label
    for family, name, labels, _value in got:
        if family.startswith("kafka_"):
            assert set(labels) <= {"consumergroup", "topic", "partition"}, name
        elif "topic" in labels or family.startswith(("txn_offsets_job_", "txn_offsets_batch_")):
            assert "txn_job" in labels, name
    by_name = {(n, tuple(sorted(lb.items()))): v for _f, n, lb, v in got}

    def value(name: str, **labels: str) -> float:
        return by_name[(name, tuple(sorted(labels.items())))]

    assert value("kafka_topic_partitions", topic=topic) == 3
    # the consumer group: the job's mirror group where one is configured, else the job's name
    assert value("kafka_consumergroup_lag", consumergroup="mirror-of-a", topic=topic, partition="0") == 3
    assert value("kafka_consumergroup_lag", consumergroup=jobs[1], topic=topic, partition="0") == 3
    assert value("kafka_consumergroup_lag_sum", consumergroup=jobs[1], topic=topic) == 4
    assert value("txn_offsets_topic_lag_records", txn_job=jobs[1], topic=topic) == 4
    assert value("txn_offsets_job_lag_records", txn_job=jobs[0]) == 4
    assert value("txn_offsets_lag_records", txn_job=jobs[0], topic=topic, partition="2") == 1
    per_part = [
        value("txn_offsets_lag_seconds", txn_job=jobs[0], topic=topic, partition=str(p)) for p in range(3)
    ]
    assert value("txn_offsets_job_lag_seconds", txn_job=jobs[0]) == max(per_part) > 0
    assert value("txn_offsets_batch_outcomes_total", txn_job=jobs[0], outcome="committed") == 3

    # every metric the docs (the metrics service's section), the rules and the dashboard name is served
    exported = {n for _f, n, _lb, _v in got} | {f for f, _n, _lb, _v in got}
    ops = (ROOT / "docs" / "operations.md").read_text()
    section = ops[ops.index("## The metrics service") : ops.index("## Mirroring offsets")]
    for doc in (
        section,
        RULES.read_text(),
        DASHBOARD.read_text(),
        (ROOT / "deploy" / "README.md").read_text(),
    ):
        fields = {"kafka_error", "kafka_facts_at"}  # of /offsets's JSON, not metrics
        named = set(re.findall(r"\b(?:txn_offsets|kafka)_[a-z_]*[a-z]\b", doc)) - {"kafka_exporter", *fields}
        assert named - exported == set(), doc[:80]
    # promtool: the whole scrape fails on kafka_exporter's lag_sum only; everything else passes
    code, out = promtool(prom, "check", "metrics", stdin=text)
    problems = [line for line in out.splitlines() if line.strip()]
    assert code == 3 and problems and all(COMPAT_EXCEPTION in line for line in problems), out
    code, out = promtool(prom, "check", "metrics", stdin=without_family(text, COMPAT_EXCEPTION))
    assert (code, out.strip()) == (0, ""), out


def _live(engine: sa.Engine, db: DatabaseSettings, job: str, offsets: dict[tuple[str, int], int]) -> Run:
    run = start_run(Store(engine, db), job)
    seed(engine, db, job, offsets)
    return run


def test_job_status_rules(
    make_client: Callable[..., TestClient],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    kafka_admin: AdminClient,
) -> None:
    topic, growing, trimmed = topic_factory(), topic_factory(), topic_factory()
    for t in (topic, growing, trimmed):
        produce_counts(kafka_bootstrap, t, {0: 10})
    job = {
        s: f"st-{s.lower()}-{os.urandom(3).hex()}" for s in ("ok", "stopped", "stalled", "lagging", "fenced")
    }
    job.update(below=f"st-below-{os.urandom(3).hex()}", above=f"st-above-{os.urandom(3).hex()}")
    _live(engine, migrated, job["ok"], {(topic, 0): 10})
    end_run(store, _live(engine, migrated, job["stopped"], {(topic, 0): 4}))
    _live(engine, migrated, job["stalled"], {(topic, 0): 4})
    lagging = _live(engine, migrated, job["lagging"], {(growing, 0): 0})
    _live(engine, migrated, job["fenced"], {(topic, 0): 10})
    _live(engine, migrated, job["below"], {(trimmed, 0): 4})
    _live(engine, migrated, job["above"], {(topic, 0): 10})
    offsets = tables_for(migrated.schema).offsets
    with engine.begin() as conn:  # a reset past the log end, as `offsets reset --to-offset` allowed
        conn.execute(sa.update(offsets).where(offsets.c.job == job["above"]).values(off=99_999_999))
    for fut in kafka_admin.delete_records([KafkaTP(trimmed, 0, 6)], request_timeout=30).values():
        fut.result(timeout=30)

    from txn_offsets.service.status import StatusRules

    client = make_client(StatusRules(stall_after_s=60.0, trend_window_s=60.0, fenced_hold_s=60.0))
    assert status_of(client, job["ok"]) == "OK"
    assert status_of(client, job["stopped"]) == "STOPPED"  # no live lease, whatever the lag
    assert status_of(client, job["below"]) == "OUT_OF_LOG"  # stored 4, log starts at 6
    assert status_of(client, job["above"]) == "OUT_OF_LOG"  # stored past the end: not "lag 0, OK"
    assert status_of(client, job["stalled"]) == "OK"  # lagging 6, but moved just now
    assert status_of(client, job["lagging"]) == "OK"  # one sample of the trend: not yet LAGGING
    assert status_of(client, job["fenced"]) == "OK"

    # the lag grows while the job commits: LAGGING (it moves, so it is not stalled)
    commit_ranges(store, lagging, [OffsetRange(growing, 0, 0, 2)])
    produce_counts(kafka_bootstrap, growing, {0: 5})
    assert stats.record_failure(store, job["fenced"], "fenced")
    assert status_of(client, job["lagging"]) == "LAGGING"  # 10 -> 13
    assert status_of(client, job["fenced"]) == "FENCED"  # its fenced count went up since
    assert status_of(client, job["fenced"]) == "FENCED"  # held for fenced_hold_s
    commit_ranges(store, lagging, [OffsetRange(growing, 0, 2, 15)])
    assert status_of(client, job["lagging"]) == "OK"  # caught up

    # a live job whose lagging partitions have not moved for stall_after_s
    quick = make_client(StatusRules(stall_after_s=0.5, trend_window_s=60.0, fenced_hold_s=60.0))
    time.sleep(0.6)
    assert status_of(quick, job["stalled"]) == "STALLED"
    assert status_of(quick, job["ok"]) == "OK"  # no lag: nothing to stall on
    body = quick.get(f"/offsets/{job['stalled']}").json()
    assert body["status"] == "STALLED"


def test_a_commit_past_the_cached_end_is_not_out_of_log(
    make_client: Callable[..., TestClient],
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    job_name: str,
) -> None:
    """Kafka's ends are cached between scrapes, the stored offsets are read fresh: a job that
    commits records produced since the last refresh is past the cached end, not out of the log."""
    topic = topic_factory()
    produce_counts(kafka_bootstrap, topic, {0: 3})
    run = _live(engine, migrated, job_name, {(topic, 0): 0})
    client = make_client(ttl_s=60.0)
    assert status_of(client, job_name) == "OK"  # the ends are cached now: 3
    produce_counts(kafka_bootstrap, topic, {0: 4})
    commit_ranges(store, run, [OffsetRange(topic, 0, 0, 7)])
    text = client.get("/metrics").text
    assert status_of(client, job_name) == "OK"
    got = {(n, lb.get("txn_job")): v for _f, n, lb, v in samples(text) if lb.get("topic") == topic}
    assert got[("txn_offsets_offset_out_of_log", job_name)] == 0
    assert got[("txn_offsets_lag_records", job_name)] == 0
    assert got[("txn_offsets_end_offset", job_name)] == 7  # at least as far as the job read
    assert client.service.kafka.refreshes == 1  # type: ignore[attr-defined]


def test_rules_pass_promtool_and_every_alert_is_tested(prom: prometheus_bin.Binaries) -> None:
    code, out = promtool(prom, "check", "rules", str(RULES))
    assert code == 0 and "SUCCESS" in out, out
    code, out = promtool(prom, "test", "rules", str(RULES_TEST))
    assert code == 0 and "SUCCESS" in out, out
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }
    assert {"TxnOffsetsLagTooHigh", "TxnOffsetsStalled", "TxnOffsetsFenced", "TxnOffsetsOutOfLog"} <= alerts
    assert alerts == fired, alerts ^ fired  # each alert fires in a fixture...
    assert alerts == quiet, alerts ^ quiet  # ...and stays quiet in another


def _dashboard_queries() -> list[tuple[str, str]]:
    """(expr with the dashboard's variables filled in, legend) of every panel target."""
    board = json.loads(DASHBOARD.read_text())
    panels = [p for row in board["panels"] for p in [row, *row.get("panels", [])]]
    fill = {"$txn_job": ".*", "$consumergroup": ".*", "$topic": ".*", "$job": "txn-offsets"}
    out = []
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            for var, value in fill.items():
                expr = expr.replace(var, value)
            out.append((expr, target.get("legendFormat", "")))
    return out


def test_live_prometheus_sees_one_series_per_job(
    prom: prometheus_bin.Binaries,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    database_url: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, topic, {0: 6, 1: 6})
    jobs = [f"live-{os.urandom(4).hex()}" for _ in range(2)]
    runs = [_live(engine, migrated, job, {(topic, 0): 0, (topic, 1): 0}) for job in jobs]
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", migrated.schema, "--port", "0"]
    serve = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        match = re.search(r"on http://(127\.0\.0\.1:\d+) ", serve.stdout.readline())
        assert match
        with prometheus_bin.running(prom, tmp_path, match.group(1), [RULES]) as live:
            # the jobs run: a range per partition and scrape, while Prometheus scrapes every second
            deadline = time.monotonic() + 40
            for step in range(6):
                for run in runs:
                    commit_ranges(store, run, [OffsetRange(topic, p, step, step + 1) for p in (0, 1)])
                    stats.record_batch(store, run.job, 0.05, {"committed": 2})
                time.sleep(0.3)
            while len(live.query("txn_offsets_job_lag_records == 0")) < 2:
                assert time.monotonic() < deadline, live.query("txn_offsets_job_lag_records")
                time.sleep(0.5)
            gen = live.query("txn_offsets_job_generation")
            assert sorted(s["metric"]["txn_job"] for s in gen) == sorted(jobs)
            assert {s["metric"]["job"] for s in gen} == {"txn-offsets"}  # Prometheus' own, not ours
            assert live.query('{exported_job!=""}') == []
            per_group = live.query("max by (consumergroup) (kafka_consumergroup_lag)")
            assert sorted(s["metric"]["consumergroup"] for s in per_group) == sorted(jobs)
            ok = live.query('max by (txn_job) (txn_offsets_job_status{status="OK"}) == 1')
            assert sorted(s["metric"]["txn_job"] for s in ok) == sorted(jobs)
            assert live.query("kafka_topic_partitions")[0]["value"][1] == "2"
            # every dashboard query runs, and the per-job ones give one series per job (rates and
            # derivatives once Prometheus has two samples of each series)
            per_job = [e for e, legend in _dashboard_queries() if legend == "{{txn_job}}"]
            assert len(per_job) >= 6
            for expr, _legend in _dashboard_queries():
                live.query(expr)
            for expr in per_job:
                while sorted(s["metric"].get("txn_job") for s in live.query(expr)) != sorted(jobs):
                    assert time.monotonic() < deadline, (expr, live.query(expr))
                    time.sleep(0.5)
            # the rules load and evaluate without errors against the live series
            while not all(r.get("lastEvaluation", "").startswith("2") for r in live.rules()):
                assert time.monotonic() < deadline, live.rules()
                time.sleep(0.5)
            assert {(r["name"], r["health"]) for r in live.rules()} == {
                (r["name"], "ok") for r in live.rules()
            }
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    assert serve.returncode == 0
