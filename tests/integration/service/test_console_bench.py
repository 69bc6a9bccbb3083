"""benchmarks/console.py at unit size (2 jobs x 64 partitions, a few runs): it seeds, asks every
page of the service's app (each answered 200, or it raises) and reports p50/p99 per page. The
figure at 32 jobs x 4,096 partitions is docs/operations.md#the-console's, not a timed test."""

from __future__ import annotations

from benchmarks.console import measure
from txn_offsets.config import DatabaseSettings, KafkaSettings


def test_console_bench_runs(database_url: str, kafka_bootstrap: str) -> None:
    db = DatabaseSettings(database_url)
    out = measure(
        db,
        KafkaSettings(kafka_bootstrap),
        jobs=2,
        partitions=64,
        runs=3,
        uncached=1,
        snapshots=2,
        own_topics=True,
    )
    assert (out["jobs"], out["partitions_per_job"], out["runs"]) == (2, 64, 3)
    for page in ("overview", "job_first_page", "job_last_page", "overview_new_snapshot"):
        figures = out[page]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"], (page, figures)
    for contender in ("before", "after"):  # the snapshot read and the one before its rewrite
        figures = out["snapshot"][contender]
        assert 0 < figures["min_ms"] <= figures["p50_ms"], (contender, figures)
