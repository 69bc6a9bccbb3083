"""Offset moves never leave the log (issue 23, part 1), against real PostgreSQL and Kafka: an
explicit `reset --to-offset` or an import outside [log start, LSO] is refused with the partition,
the asked offset and the log's bounds; `--shift-by` clamps (as kafka-consumer-groups.sh does);
`--allow-outside-log` forces it, audited; a seed by StartPolicy.explicit outside the log is refused;
`offsets lag` and /metrics' collector flag a stored offset outside the log instead of lag 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from tests.integration.helpers import Cli, offsets_of, produce_counts, seed
from tests.unit.test_checkpoint import write_checkpoint
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits, TopicSelection, plan_batch
from txn_offsets.service.collector import StoreCollector
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.snapshot import read_snapshot
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run
from txn_offsets.store.schema import tables_for


def reasons(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[str, int, int | None, int, str]]:
    a = tables_for(db.schema).audit
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(a.c.topic, a.c.part, a.c.old_off, a.c.new_off, a.c.reason)
            .where(a.c.job == job, a.c.action != "seed")
            .order_by(a.c.id)
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.fixture
def topic(kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: Callable[..., str]) -> str:
    """Two partitions: p0 holds offsets 0-9, p1 holds 3-9 (0-2 deleted: its log starts at 3)."""
    name = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, name, {0: 10, 1: 10})
    futures = kafka_admin.delete_records([KafkaTP(name, 1, 3)], request_timeout=30)
    for fut in futures.values():
        fut.result(timeout=30)
    return name


def test_reset_to_an_offset_outside_the_log_is_refused_unless_forced(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str
) -> None:
    s = ["--schema", migrated.schema]
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 4, (topic, 1): 5})
    reset = ["offsets", "reset", "--job", job_name, "--topic", topic, "--reason", "ops", "--force", *s]

    for asked, part in ((99999999, 0), (1, 1)):  # past the end of p0, below the log start of p1
        code, out, err = run_cli(*reset, "--partition", str(part), "--to-offset", str(asked))
        assert code == 1, out
        assert err.count("\n") == 1 and err.startswith("txn-offsets: error: --allow-outside-log")
        bounds = "[0, 10]" if part == 0 else "[3, 10]"
        assert f"{topic}[{part}]" in err and str(asked) in err and bounds in err, err
        assert "reset plan" not in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 4, (topic, 1): 5}
    assert reasons(engine, migrated, job_name) == []

    # inside the log (both ends included): moved as asked
    code, _, err = run_cli(*reset, "--partition", "1", "--to-offset", "3")
    assert code == 0, err
    code, _, err = run_cli(*reset, "--partition", "0", "--to-offset", "10")
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 10, (topic, 1): 3}

    # forced: moved, and the audit row says it was forced and where the log was
    code, out, err = run_cli(*reset, "--partition", "0", "--to-offset", "99999999", "--allow-outside-log")
    assert code == 0, err
    assert f"{topic}[0] offset 99999999 is past the end of the log [0, 10]: moved there anyway" in out
    assert offsets_of(engine, migrated, job_name)[(topic, 0)] == 99999999
    last = reasons(engine, migrated, job_name)[-1]
    assert last[:4] == (topic, 0, 10, 99999999)
    assert last[4].startswith("ops") and "--allow-outside-log" in last[4] and "[0, 10]" in last[4], last


def test_shift_by_clamps_to_the_log(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str
) -> None:
    s = ["--schema", migrated.schema]
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 4, (topic, 1): 5})
    reset = ["offsets", "reset", "--job", job_name, "--topic", topic, "--reason", "ops", "--force", *s]

    code, out, err = run_cli(*reset, "--shift-by", "99999999", "--dry-run")
    assert code == 0, err
    assert f"{topic}[0]  4 -> 10  (+6)" in out and f"{topic}[1]  5 -> 10  (+5)" in out
    assert "clamped" in out and "100000003" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 4, (topic, 1): 5}

    code, out, err = run_cli(*reset, "--shift-by", "-99")
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 0, (topic, 1): 3}
    assert all("clamped" in r[4] for r in reasons(engine, migrated, job_name))

    code, out, err = run_cli(*reset, "--shift-by", "99999999", "--allow-outside-log")
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 99999999, (topic, 1): 100000002}


def test_lag_flags_a_stored_offset_outside_the_log(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    job_name: str,
    topic: str,
    kafka_bootstrap: str,
) -> None:
    s = ["--schema", migrated.schema]
    start_run(store, job_name)
    seed(engine, migrated, job_name, {(topic, 0): 99999999, (topic, 1): 1})

    code, out, err = run_cli("offsets", "lag", "--job", job_name, "--format", "json", *s)
    assert code == 0, err
    parts = {p["partition"]: p for p in json.loads(out)["partitions"]}
    assert parts[0]["status"] == "OUT_OF_LOG" and parts[1]["status"] == "OUT_OF_LOG"
    assert json.loads(out)["out_of_log"] == 2
    code, out, err = run_cli("offsets", "lag", "--job", job_name, *s)
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith(topic)]
    assert len(rows) == 2 and all("OUT_OF_LOG" in line for line in rows), out
    assert "past the end of the log [0, 10]" in rows[0] and "2 offsets deleted" in rows[1]
    assert out.splitlines()[-1].endswith("; 2 partition(s) OUT_OF_LOG")
    # a probe must not pass a job whose next run stops with DataLoss
    code, _, err = run_cli("offsets", "lag", "--job", job_name, "--fail-over", "1000", *s)
    assert code != 0 and "outside the log" in err

    # /metrics: one gauge per partition, 1 where the stored offset is outside the log
    start_run(store, f"{job_name}-ok")
    seed(engine, migrated, f"{job_name}-ok", {(topic, 0): 5})
    view = KafkaView(KafkaSettings(kafka_bootstrap), ttl_s=0)
    families = list(StoreCollector(lambda: read_snapshot(store, view)).collect())
    (gauge,) = [f for f in families if f.name == "txn_offsets_offset_out_of_log"]
    got = {
        (next(v for k, v in x.labels.items() if v.startswith(job_name)), x.labels["partition"]): x.value
        for x in gauge.samples
        if x.labels["topic"] == topic
    }
    ok = f"{job_name}-ok"  # its partition 1 has no row yet: it starts at the log start, inside
    assert got == {(job_name, "0"): 1.0, (job_name, "1"): 1.0, (ok, "0"): 0.0, (ok, "1"): 0.0}


def test_import_outside_the_log_is_refused_unless_forced(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str, tmp_path: Path
) -> None:
    s = ["--schema", migrated.schema]
    cmd = ["offsets", "import", "--job", job_name, *s]
    for offsets, part, bounds in (({0: 11, 1: 5}, 0, "[0, 10]"), ({0: 2, 1: 1}, 1, "[3, 10]")):
        ckpt = tmp_path / f"q{part}"
        write_checkpoint(ckpt, [{topic: offsets}], 1)
        code, out, err = run_cli(*cmd, "--from-spark-checkpoint", str(ckpt))
        error = err.splitlines()[-1]
        assert code == 1 and error.startswith("txn-offsets: error: --allow-outside-log"), err
        assert f"{topic}[{part}]" in error and bounds in error and str(offsets[part]) in error
        assert offsets_of(engine, migrated, job_name) == {}

    code, out, err = run_cli(*cmd, "--from-spark-checkpoint", str(tmp_path / "q1"), "--allow-outside-log")
    assert code == 0, err
    assert "offset 1 is below the start of the log [3, 10]: imported anyway" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 2, (topic, 1): 1}
    a = tables_for(migrated.schema).audit
    with engine.connect() as conn:
        why = dict(conn.execute(sa.select(a.c.part, a.c.reason).where(a.c.job == job_name)).all())
    assert "--allow-outside-log" in why[1] and "[3, 10]" in why[1] and "--allow-outside-log" not in why[0]


def test_an_explicit_start_outside_the_log_is_refused(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str, kafka_bootstrap: str
) -> None:
    """No force for a seed: the same plan would find it outside the log and stop with DataLoss."""
    kafka = KafkaSettings(kafka_bootstrap)
    start_run(Store(engine, migrated), job_name)
    selection = TopicSelection(topics=(topic,))
    for asked, part, bounds in ((1, 1, "[3, 10]"), (11, 0, "[0, 10]")):
        with pytest.raises(ConfigError) as refused:
            plan_batch(
                Store(engine, migrated),
                kafka,
                job=job_name,
                selection=selection,
                start=StartPolicy.explicit({(topic, part): asked}),
                limits=Limits(),
            )
        text = str(refused.value)
        assert f"{topic}[{part}]" in text and bounds in text and f"offset {asked} " in text, text
    assert offsets_of(engine, migrated, job_name) == {}
    plan = plan_batch(
        Store(engine, migrated),
        kafka,
        job=job_name,
        selection=selection,
        start=StartPolicy.explicit({(topic, 1): 3, (topic, 0): 10}),
        limits=Limits(),
    )
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 10, (topic, 1): 3}
    assert plan.lag == 7
