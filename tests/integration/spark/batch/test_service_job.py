"""`txn-offsets serve` scraped while a real job runs: every scrape parses with prometheus-client's
parser, stored offsets only move forward and never pass the end, and after the run the metrics
equal the offsets table, the broker's watermarks and the run's own summary."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.spark.counting import Counting
from txn_offsets.config import DatabaseSettings
from txn_offsets.plan.planner import Limits

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def served(database_url: str, kafka_bootstrap: str, db: DatabaseSettings) -> Iterator[str]:
    """A real `txn-offsets serve` (uvicorn) on a free loopback port; its base URL."""
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", db.schema, "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--kafka-cache-s", "0.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", proc.stdout.readline())
        assert match, proc.stderr.read() if proc.stderr else ""
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_metrics_while_a_job_runs(counting: Counting, served: str) -> None:
    parts = 4
    topic, _ = counting.topic(parts, 12_000)
    ends = counting.ends(topic, parts)
    scrapes: list[Samples] = []
    done = threading.Event()

    def scraper() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                response = client.get(f"{served}/metrics")
                assert response.status_code == 200
                scrapes.append(parse(response.text))
                time.sleep(0.2)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        # the runner records each batch's statistics (job_stats) itself
        summary = counting.run(topic, limits=Limits(max_records_per_partition=600))
    finally:
        time.sleep(1.0)  # one more scrape after the end
        done.set()
        thread.join(30)
    assert summary.batches >= 5 and summary.records == 12_000

    # while it ran: a live job was seen mid-way, and no stored offset went back or past the end
    mid = [
        s
        for s in scrapes
        if get(s, "txn_offsets_job_live", txn_job=counting.job) == 1
        and 0
        < sum(
            get(s, "txn_offsets_stored_offset", txn_job=counting.job, topic=topic, partition=str(p)) or 0
            for p in range(parts)
        )
        < 12_000
    ]
    assert mid, f"no scrape saw the job mid-run ({len(scrapes)} scrapes)"
    for p in range(parts):
        seen = [
            v
            for s in scrapes
            if (v := get(s, "txn_offsets_stored_offset", txn_job=counting.job, topic=topic, partition=str(p)))
            is not None
        ]
        assert seen == sorted(seen) and max(seen) <= ends[(topic, p)]

    # after it: equal to the table, the broker and the summary
    final = parse(httpx.get(f"{served}/metrics", timeout=30).text)
    table = counting.offsets()
    assert table == ends
    for p in range(parts):
        group = {"consumergroup": counting.job, "topic": topic, "partition": str(p)}
        assert get(final, "kafka_consumergroup_current_offset", **group) == table[(topic, p)]
        assert get(final, "kafka_consumergroup_lag", **group) == 0
        assert (
            get(final, "kafka_topic_partition_current_offset", topic=topic, partition=str(p))
            == ends[(topic, p)]
        )
        assert get(final, "txn_offsets_lag_seconds", txn_job=counting.job, topic=topic, partition=str(p)) == 0
    assert get(final, "kafka_consumergroup_lag_sum", consumergroup=counting.job, topic=topic) == 0
    assert get(final, "txn_offsets_job_live", txn_job=counting.job) == 0
    assert get(final, "txn_offsets_job_generation", txn_job=counting.job) == summary.generation
    assert get(final, "txn_offsets_batch_duration_seconds_count", txn_job=counting.job) == summary.batches
    committed = get(final, "txn_offsets_batch_outcomes_total", txn_job=counting.job, outcome="committed")
    assert committed == summary.committed
