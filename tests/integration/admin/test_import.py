"""`txn-offsets offsets import` end to end from each source (Spark checkpoint, consumer group, legacy
table): the plan first, dry runs change nothing, a job with offsets is refused unless --force, every
import is audited and bumps the generation, and bad input is one error line that changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.helpers import Cli, offsets_of, produce_counts, seed
from tests.unit.test_checkpoint import write_checkpoint
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import UnknownJob
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job, start_run
from txn_offsets.store.schema import tables_for


def generation(engine: sa.Engine, db: DatabaseSettings, job: str) -> int:
    with engine.connect() as conn:
        return lock_job(conn, db, job, for_update=False).generation


def audit(
    engine: sa.Engine, db: DatabaseSettings, job: str
) -> list[tuple[str, int, int | None, int, str, str]]:
    a = tables_for(db.schema).audit
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(a.c.topic, a.c.part, a.c.old_off, a.c.new_off, a.c.action, a.c.reason)
            .where(a.c.job == job)
            .order_by(a.c.id)
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.fixture
def topic(kafka_bootstrap: str, topic_factory: Callable[..., str]) -> str:
    name = topic_factory(partitions=3)
    produce_counts(kafka_bootstrap, name, {0: 10, 1: 10, 2: 10})
    return name


def test_import_from_a_spark_checkpoint(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str, tmp_path: Path
) -> None:
    s = ["--schema", migrated.schema]
    ckpt = tmp_path / "query"
    # batches 0 and 1 committed, batch 2 planned but not committed (the query stopped mid-batch)
    write_checkpoint(
        ckpt, [{topic: {0: 2, 1: 2, 2: 2}}, {topic: {0: 5, 1: 4, 2: 6}}, {topic: {0: 9, 1: 9, 2: 9}}], 2
    )
    cmd = ["offsets", "import", "--job", job_name, "--from-spark-checkpoint", str(ckpt), *s]

    code, out, err = run_cli(*cmd, "--dry-run")
    assert code == 1 and out == "" and "batch 2 was planned but not committed (last committed: 1)" in err
    assert err.count("txn-offsets: error:") == 1 and err.endswith("\n") and err.count("\n") == 1

    code, out, err = run_cli(*cmd, "--checkpoint-batch", "1", "--dry-run")
    assert code == 0, err
    assert f"import plan for job {job_name!r} (new job) from spark checkpoint {ckpt} (batch 1):" in out
    assert f"  {topic}[0]  (none) -> 5  (log 0..10)" in out and "dry run: nothing changed" in out
    with engine.connect() as conn, pytest.raises(UnknownJob):
        lock_job(conn, migrated, job_name, for_update=False)  # not even the job row

    code, out, err = run_cli(*cmd, "--checkpoint-batch", "1", "--reason", "move off SSS")
    assert code == 0, err
    assert out.splitlines()[-1] == f"imported 3 partition(s) into job {job_name!r}; generation is now 1"
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 5, (topic, 1): 4, (topic, 2): 6}
    reason = f"import from spark checkpoint {ckpt} (batch 1): move off SSS [incarnation of {topic}: "
    rows = audit(engine, migrated, job_name)
    assert [r[:5] for r in rows] == [(topic, p, None, o, "import") for p, o in ((0, 5), (1, 4), (2, 6))]
    assert all(r[5].startswith(reason) for r in rows), rows

    # the job has offsets now: refused without --force, nothing changes
    code, out, err = run_cli(*cmd, "--checkpoint-batch", "2")
    assert code == 1 and "already has offsets for 3 partition(s)" in err and "--force" in err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 5, (topic, 1): 4, (topic, 2): 6}
    code, out, err = run_cli(*cmd, "--checkpoint-batch", "2", "--force")
    assert code == 0, err
    assert f"  {topic}[1]  4 -> 9  (+5)" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 9, (topic, 1): 9, (topic, 2): 9}
    assert generation(engine, migrated, job_name) == 2
    assert [r[4] for r in audit(engine, migrated, job_name)][3:] == ["reset"] * 3


def test_import_from_a_consumer_group(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    topic: str,
    kafka_bootstrap: str,
) -> None:
    group = f"legacy-{uuid.uuid4().hex[:8]}"
    assert GroupMirror(KafkaSettings(kafka_bootstrap), group).commit({(topic, 0): 7, (topic, 2): 3})
    live = start_run(Store(engine, migrated), job_name)  # an existing job without offsets, with a live run
    cmd = [
        "offsets",
        "import",
        "--job",
        job_name,
        "--from-consumer-group",
        group,
        "--schema",
        migrated.schema,
    ]
    code, out, err = run_cli(*cmd)
    assert code == 1 and live.run_id in err and "--force" in err
    assert f"no offset in the source for {topic}[1]: the job starts those at their log start" in out
    code, out, err = run_cli(*cmd, "--force")
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 7, (topic, 2): 3}
    assert generation(engine, migrated, job_name) == live.generation + 1  # the live run is fenced
    with engine.connect() as conn:
        assert not lock_job(conn, migrated, job_name, for_update=False).live


def test_import_from_a_legacy_table(
    run_cli: Cli, engine: sa.Engine, migrated: DatabaseSettings, job_name: str, topic: str
) -> None:
    legacy = f'"{migrated.schema}".legacy_offsets'
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {legacy} (app text, topic text, part int, off bigint)"))
        conn.execute(
            sa.text(f"INSERT INTO {legacy} VALUES ('a', :t, 0, 4), ('a', :t, 1, 8), ('b', :t, 0, 1)"),
            {"t": topic},
        )
    base = ["offsets", "import", "--job", job_name, "--schema", migrated.schema]
    table = ["--from-table", f"{migrated.schema}.legacy_offsets", "--current-topic-incarnation"]
    code, _, err = run_cli(*base, *table)
    assert code == 1 and "two offsets for" in err  # two apps share the table
    code, _, err = run_cli(*base, *table, "--table-filter", "app=a")
    assert code == 0, err
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 4, (topic, 1): 8}
    code, _, err = run_cli(*base, *table, "--table-columns", "topic,part,nope", "--force")
    assert code == 1 and "give three of the columns" in err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (["--from-spark-checkpoint", "/nonexistent/ckpt"], "is not a directory"),
        (["--from-spark-checkpoint", "CORRUPT"], "expected the log version 'v1'"),
        (["--from-consumer-group", "never-used-group-xyz"], "has no committed offsets"),
        (["--from-table", "nope", "--current-topic-incarnation"], "give SCHEMA.TABLE"),
        (["--from-table", "public.no_such_table_xyz", "--current-topic-incarnation"], "does not exist"),
        (["--from-table", "Bad.Name", "--current-topic-incarnation"], "not a valid identifier"),
        (["--from-spark-checkpoint", "PAST_END"], "is past the end of the log"),
        (["--from-spark-checkpoint", "NO_PARTITION"], "has no partition 7"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    topic: str,
    tmp_path: Path,
    source: list[str],
    message: str,
) -> None:
    seed_job = f"{job_name}-other"
    start_run(Store(engine, migrated), seed_job)
    seed(engine, migrated, seed_job, {(topic, 0): 1})
    if source[1] == "CORRUPT":
        write_checkpoint(tmp_path / "c", [{topic: {0: 1}}], 1)
        (tmp_path / "c" / "offsets" / "0").write_text("garbage\n{}\n{}\n")
    elif source[1] in ("PAST_END", "NO_PARTITION"):
        write_checkpoint(tmp_path / "c", [{topic: {0: 11} if source[1] == "PAST_END" else {7: 0}}], 1)
    if source[1].isupper():
        source = [source[0], str(tmp_path / "c")]
    before = offsets_of(engine, migrated, seed_job)
    code, out, err = run_cli("offsets", "import", "--job", job_name, *source, "--schema", migrated.schema)
    # stderr: progress lines (not a terminal: plain "import: i/n ..." lines), then one error line
    *progress, error = err.splitlines()
    assert code == 1 and error.startswith("txn-offsets: error:") and message in error
    assert all(line.startswith("import: ") for line in progress)
    assert "import plan" not in out
    with engine.connect() as conn, pytest.raises(UnknownJob):
        lock_job(conn, migrated, job_name, for_update=False)
    assert offsets_of(engine, migrated, seed_job) == before


def test_a_source_of_several_topics_imports_only_the_named_ones(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    topic: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    """A checkpoint of a query that read two topics: a new job must say which it reads (--topic);
    the other topic is listed as not imported and never gets a row (a row nothing moves would show
    its lag forever); a --topic the source lacks is an error naming the topics it holds."""
    other = topic_factory(partitions=1)
    produce_counts(kafka_bootstrap, other, {0: 4})
    ckpt = tmp_path / "query"
    write_checkpoint(ckpt, [{topic: {0: 5, 1: 4, 2: 6}, other: {0: 3}}], 1)
    cmd = ["offsets", "import", "--job", job_name, "--from-spark-checkpoint", str(ckpt)]
    cmd += ["--schema", migrated.schema]

    code, out, err = run_cli(*cmd, "--dry-run")
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: --topic:")
    assert f"holds offsets for 2 topics ({', '.join(sorted([topic, other]))})" in error
    assert "pass --topic for each topic the job reads" in error

    code, out, err = run_cli(*cmd, "--topic", "never-read", "--topic", topic)
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: --topic:")
    assert f"'never-read' is not in spark checkpoint {ckpt} (batch 0)" in error
    assert f"it holds offsets for {', '.join(sorted([topic, other]))}" in error
    with engine.connect() as conn, pytest.raises(UnknownJob):
        lock_job(conn, migrated, job_name, for_update=False)  # nothing written by any of these

    code, out, err = run_cli(*cmd, "--topic", topic, "--topic", topic, "--dry-run")
    assert code == 0, err
    assert f"  {topic}[1]  (none) -> 4  (log 0..10)" in out
    assert f"  {other}  not imported (1 partition(s) in the source)" in out
    assert f"{other}[" not in out and "dry run: nothing changed" in out
    with engine.connect() as conn, pytest.raises(UnknownJob):
        lock_job(conn, migrated, job_name, for_update=False)

    code, out, err = run_cli(*cmd, "--topic", topic)
    assert code == 0, err
    assert out.splitlines()[-1] == f"imported 3 partition(s) into job {job_name!r}; generation is now 1"
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 5, (topic, 1): 4, (topic, 2): 6}
    assert {r[0] for r in audit(engine, migrated, job_name)} == {topic}


def test_an_existing_job_imports_its_own_topics_by_default(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    topic: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    """A consumer group that also consumed another topic: a job that has offset rows takes only
    its own topics from it (the others are listed as not imported); a source that holds none of
    the job's topics is an error naming both sides, unless --topic says which to take."""
    other = topic_factory(partitions=2)
    produce_counts(kafka_bootstrap, other, {0: 3, 1: 3})
    group = f"legacy-{uuid.uuid4().hex[:8]}"
    offsets = {(topic, 0): 7, (topic, 1): 8, (topic, 2): 9, (other, 0): 2, (other, 1): 1}
    assert GroupMirror(KafkaSettings(kafka_bootstrap), group).commit(offsets)
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, p): 1 for p in range(3)})
    cmd = ["offsets", "import", "--job", job_name, "--from-consumer-group", group]
    cmd += ["--schema", migrated.schema]

    code, out, err = run_cli(*cmd, "--force")
    assert code == 0, err
    assert f"  {topic}[0]  1 -> 7  (+6)" in out
    assert f"  {other}  not imported (2 partition(s) in the source)" in out
    assert offsets_of(engine, migrated, job_name) == {(topic, 0): 7, (topic, 1): 8, (topic, 2): 9}

    lone = f"{job_name}-lone"
    start_run(Store(engine, migrated), lone)
    seed(engine, migrated, lone, {("elsewhere", 0): 1})
    code, out, err = run_cli(*cmd[:3], lone, *cmd[4:], "--force")
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: --topic:")
    assert f"job {lone!r} reads elsewhere" in error
    assert f"holds offsets for {', '.join(sorted([topic, other]))} only" in error
    assert offsets_of(engine, migrated, lone) == {("elsewhere", 0): 1}
    code, out, err = run_cli(*cmd[:3], lone, *cmd[4:], "--force", "--topic", other)
    assert code == 0, err
    assert f"  {topic}  not imported (3 partition(s) in the source)" in out
    assert offsets_of(engine, migrated, lone) == {("elsewhere", 0): 1, (other, 0): 2, (other, 1): 1}
