"""The README's usage example runs as written (with a fresh topic, job and table name)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from tests.fix_services import REPO, TopicFactory
from txn_offsets.config import DatabaseSettings


def readme_example(name: str = "usage-example") -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(rf"<!-- {name}[^>]*-->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, f"README.md lost its {name} block"
    return match.group(1)


def test_readme_usage_example_runs(
    spark: Any,
    engine: sa.Engine,
    db: DatabaseSettings,
    topic_factory: TopicFactory,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=3)
    table = f"word_counts_{uuid.uuid4().hex[:8]}"
    job = f"word-count-{uuid.uuid4().hex[:8]}"
    sentences = ["the quick brown fox", "jumps over the lazy dog", "the end"] * 50
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, sentence in enumerate(sentences):
        producer.produce(topic, value=sentence.encode(), partition=i % 3)
    assert producer.flush(30) == 0
    with engine.begin() as conn:
        conn.execute(
            sa.text(f'CREATE TABLE "{db.schema}".{table} (word text PRIMARY KEY, n bigint NOT NULL)')
        )
    code = readme_example() + readme_example("stream-example")
    code = code.replace('"sentences"', repr(topic)).replace('job="word-count"', f"job={job!r}")
    code = code.replace('"word-count-stream"', repr(f"{job}-stream"))
    code = code.replace('"/tmp/txn-offsets-checkpoints"', repr(str(tmp_path)))
    code = code.replace(
        'sa.Table("word_counts", sa.MetaData(),', f"sa.Table({table!r}, sa.MetaData(schema={db.schema!r}),"
    )
    monkeypatch.setenv("TXN_OFFSETS_DATABASE_URL", database_url)
    monkeypatch.setenv("TXN_OFFSETS_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("TXN_OFFSETS_SCHEMA", db.schema)
    exec(compile(code, str(Path("README.md")), "exec"), {"__name__": "readme_example"})  # noqa: S102
    assert f"{len(sentences)} records counted exactly once" in capsys.readouterr().out
    with engine.connect() as conn:
        counts = dict(conn.execute(sa.text(f'SELECT word, n FROM "{db.schema}".{table}')).all())
    # counted twice: by the job, and by the same job as a Structured Streaming query
    assert counts["the"] == 2 * 150  # once in each of the three sentences, 50 times over
    assert sum(counts.values()) == 2 * sum(len(s.split()) for s in sentences)
