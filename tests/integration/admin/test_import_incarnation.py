"""`offsets import` never stores a source's offsets under the current Kafka topic id without evidence
that they were taken in that incarnation of the topic (issue 41, item 1), against real PostgreSQL and
Kafka.

The loss it prevents: a Structured Streaming checkpoint says T[0] = 60; T is deleted and re-created
and gets 100 records. The import used to plan ``T[0]  (none) -> 60  (log 0..100)``, store the NEW
topic's id with it, and the job counted 40 records: the new topic's first 60 were passed over, with
no DataLoss and no audit note. Now a checkpoint's batch time is checked against the log (every
record before an imported offset must be older than the checkpoint), a legacy table needs the
operator's word (``--topic-id T=ID``, checked against Kafka, or ``--current-topic-incarnation``),
a consumer group's offsets are trusted because Kafka deletes them with their topic, and the plan
and every audit row say which evidence was used."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.helpers import Cli, offsets_of, produce_counts
from tests.kafka_topics import recreate_topic
from tests.unit.test_checkpoint import write_checkpoint
from txn_offsets.admin.imports import plan_import
from txn_offsets.admin.sources import Incarnation, from_checkpoint
from txn_offsets.cli.exits import USAGE
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, UnknownJob
from txn_offsets.kafka import metadata
from txn_offsets.kafka.mirror import GroupMirror, group_offsets
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import lock_job
from txn_offsets.store.schema import tables_for


def checkpoint_at(root: Path, offsets: dict[str, dict[int, int]], written_at_ms: int | None) -> Path:
    """A checkpoint whose one committed batch ends at `offsets`, stamped `written_at_ms` (Spark's
    ``batchTimestampMs``; None: a checkpoint whose metadata has none)."""
    write_checkpoint(root, [offsets], 1)
    path = root / "offsets" / "0"
    version, meta_line, *sources = path.read_text().splitlines()
    meta = json.loads(meta_line)
    meta.pop("batchTimestampMs")
    if written_at_ms is not None:
        meta["batchTimestampMs"] = written_at_ms
    path.write_text("\n".join([version, json.dumps(meta), *sources]))
    return root


def now_ms() -> int:
    """The time a checkpoint is written: after every record produced so far (the clock moves on
    first, as Spark stamps a batch after it fetched the offsets)."""
    time.sleep(0.05)
    stamp = int(time.time() * 1000)
    time.sleep(0.05)
    return stamp


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def audit(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[str, int, int, str, str]]:
    a = tables_for(db.schema).audit
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(a.c.topic, a.c.part, a.c.new_off, a.c.action, a.c.reason)
            .where(a.c.job == job)
            .order_by(a.c.id)
        ).all()
    return [tuple(r) for r in rows]


def stored_ids(engine: sa.Engine, db: DatabaseSettings, job: str) -> set[str | None]:
    o = tables_for(db.schema).offsets
    with engine.connect() as conn:
        return set(conn.execute(sa.select(o.c.topic_id).where(o.c.job == job)).scalars())


def no_job(engine: sa.Engine, db: DatabaseSettings, job: str) -> bool:
    """Nothing of `job` was written: no job row (an import creates one), no offsets, no audit."""
    with engine.connect() as conn:
        try:
            lock_job(conn, db, job, for_update=False)
        except UnknownJob:
            return offsets_of(engine, db, job) == {} and audit(engine, db, job) == []
    return False


@dataclass(frozen=True)
class Importing:
    """An import test's job: its migrated schema and engine, Kafka and fresh topics."""

    engine: sa.Engine
    db: DatabaseSettings
    job: str
    bootstrap: str
    topic_factory: TopicFactory

    def topic(self, partitions: int, counts: dict[int, int]) -> str:
        """A new topic of `partitions` partitions, counts[p] records produced to partition p."""
        topic = self.topic_factory(partitions=partitions)
        produce_counts(self.bootstrap, topic, counts)
        return topic

    def command(self, *source: str, job: str | None = None) -> list[str]:
        """`offsets import` of the job (or `job`) from `source` into the schema."""
        return ["offsets", "import", "--job", job or self.job, *source, "--schema", self.db.schema]


@pytest.fixture
def imp(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
) -> Importing:
    return Importing(engine, migrated, job_name, kafka_bootstrap, topic_factory)


def topic_id(kafka_bootstrap: str, topic: str) -> str:
    return metadata.describe_topics(KafkaSettings(kafka_bootstrap), [topic])[topic].topic_id


def test_a_checkpoint_of_a_deleted_and_recreated_topic_is_refused_not_stored_under_the_new_id(
    run_cli: Cli, imp: Importing, kafka_admin: AdminClient, tmp_path: Path
) -> None:
    """The loss of issue 41: 60 records read by the query, its checkpoint written at t; the topic is
    deleted and re-created with 100 records. Importing T[0] = 60 under the new id passed over the
    new topic's first 60 records; now it is refused, naming the topic, the checkpoint's time and
    the log's first record time, and nothing is written. A topic id the operator names must be
    Kafka's current one; naming it overrides the time check, and the plan and audit say so."""
    topic = imp.topic(1, {0: 60})
    old_id = topic_id(imp.bootstrap, topic)
    written = now_ms()
    ckpt = checkpoint_at(tmp_path / "query", {topic: {0: 60}}, written)
    cmd = imp.command("--from-spark-checkpoint", str(ckpt))

    recreate_topic(kafka_admin, topic, 1, gone_s=0.2)
    produce_counts(imp.bootstrap, topic, {0: 100})
    new_id = topic_id(imp.bootstrap, topic)
    assert new_id != old_id

    code, out, err = run_cli(*cmd)
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: import: "), err
    assert f"spark checkpoint {ckpt} (batch 0) was written at {iso(written)}" in error
    assert f"{topic}[0] (topic id {new_id}, log 0..100)" in error
    assert "the log's first record was written at " in error
    assert f"{topic} was created after the source was written (deleted and re-created since)" in error
    assert "would pass over offsets 0..59 of the current topic, never read" in error
    assert f"--topic-id {topic}={new_id} or --current-topic-incarnation" in error
    assert no_job(imp.engine, imp.db, imp.job)

    # the id the checkpoint was taken in is not Kafka's any more: refused, both ids named
    code, out, err = run_cli(*cmd, "--topic-id", f"{topic}={old_id}")
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: --topic-id: "), err
    assert f"{topic}={old_id}, but Kafka's {topic} has topic id {new_id}" in error
    assert no_job(imp.engine, imp.db, imp.job)

    # the operator's word overrides the time check: imported, the contradiction noted and audited
    code, out, err = run_cli(*cmd, "--topic-id", f"{topic}={new_id}", "--reason", "ops says so")
    assert code == 0, err
    assert f"  {topic}[0]  (none) -> 60  (log 0..100)" in out
    assert f"note: spark checkpoint {ckpt} (batch 0) was written at {iso(written)}" in out
    assert "imported on the operator's word" in out
    said = f"topic id {new_id} named with --topic-id, over the source's time ({iso(written)})"
    assert f"incarnation of {topic}: {said}" in out
    ((t, p, off, action, reason),) = audit(imp.engine, imp.db, imp.job)
    assert (t, p, off, action) == (topic, 0, 60, "import")
    assert reason.startswith(f"import from spark checkpoint {ckpt} (batch 0): ops says so")
    assert f"[incarnation of {topic}: {said}" in reason
    assert stored_ids(imp.engine, imp.db, imp.job) == {new_id}


def test_a_checkpoint_whose_time_holds_is_imported_with_its_evidence(
    run_cli: Cli, imp: Importing, tmp_path: Path
) -> None:
    """The same topic the query read, records arriving after its checkpoint (a live topic): every
    record before the imported offsets is older than the checkpoint, so it is imported; the plan
    prints that evidence and the audit rows record it. A partition at its log start passes over
    nothing and needs no time."""
    topic = imp.topic(2, {0: 10})
    written = now_ms()
    produce_counts(imp.bootstrap, topic, {0: 5, 1: 7})  # after the checkpoint
    tid = topic_id(imp.bootstrap, topic)
    ckpt = checkpoint_at(tmp_path / "query", {topic: {0: 10, 1: 0}}, written)

    code, out, err = run_cli(*imp.command("--from-spark-checkpoint", str(ckpt)))
    assert code == 0, err
    assert (
        f"  {topic}[0]  (none) -> 10  (log 0..15)" in out and f"  {topic}[1]  (none) -> 0  (log 0..7)" in out
    )
    said = (
        f"no record of topic id {tid} before the imported offsets was written after the source's "
        f"time {iso(written)} (Kafka's offsets for that time)"
    )
    assert f"incarnation of {topic}: {said}" in out
    assert offsets_of(imp.engine, imp.db, imp.job) == {(topic, 0): 10, (topic, 1): 0}
    reason = f"import from spark checkpoint {ckpt} (batch 0) [incarnation of {topic}: {said}]"
    assert audit(imp.engine, imp.db, imp.job) == [
        (topic, p, o, "import", reason) for p, o in ((0, 10), (1, 0))
    ]
    assert stored_ids(imp.engine, imp.db, imp.job) == {tid}

    # only at the log start: nothing passed over, nothing to check against the time
    other = f"{imp.job}-start"
    ckpt = checkpoint_at(tmp_path / "start", {topic: {0: 0, 1: 0}}, written)
    code, out, err = run_cli(*imp.command("--from-spark-checkpoint", str(ckpt), job=other))
    assert code == 0, err
    assert f"incarnation of {topic}: the imported offsets pass over no record of topic id {tid}" in out


def test_records_newer_than_the_checkpoint_before_its_offsets_are_refused(
    run_cli: Cli, imp: Importing, tmp_path: Path
) -> None:
    """A log whose first records are older than the checkpoint but whose records just before the
    imported offset are newer: the query cannot have read them (a clock ahead of the driver's, or
    records with timestamps of their own). Unproven is refused: the operator decides."""
    topic = imp.topic(1, {0: 5})
    written = now_ms()
    produce_counts(imp.bootstrap, topic, {0: 5})
    ckpt = checkpoint_at(tmp_path / "query", {topic: {0: 10}}, written)
    cmd = imp.command("--from-spark-checkpoint", str(ckpt))

    code, out, err = run_cli(*cmd, "--dry-run")
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: import: "), err
    assert f"{topic}[0] (topic id {topic_id(imp.bootstrap, topic)}, log 0..10)" in error
    assert "before the offset 10 to import (from offset 5;" in error
    assert "the source did not read those records" in error and "re-created since" not in error
    assert no_job(imp.engine, imp.db, imp.job)

    code, out, err = run_cli(*cmd, "--current-topic-incarnation")
    assert code == 0, err
    assert "on the operator's word (--current-topic-incarnation), over the source's time" in out
    assert "--current-topic-incarnation" in audit(imp.engine, imp.db, imp.job)[0][4]


def test_a_checkpoint_without_a_batch_time_needs_the_operators_word(
    run_cli: Cli, imp: Importing, store: Store, tmp_path: Path
) -> None:
    """No evidence in the source: the CLI and the API refuse, naming both flags; with one, imported
    and audited as the operator's word."""
    topic = imp.topic(1, {0: 10})
    tid = topic_id(imp.bootstrap, topic)
    ckpt = checkpoint_at(tmp_path / "query", {topic: {0: 4}}, None)
    cmd = imp.command("--from-spark-checkpoint", str(ckpt))

    code, out, err = run_cli(*cmd)
    error = err.splitlines()[-1]
    assert code == 1 and out == "" and error.startswith("txn-offsets: error: --topic-id: "), err
    assert f"does not say which incarnation of {topic} its offsets were taken in" in error
    assert f"pass --topic-id {topic}=ID" in error and f"Kafka's, now {tid}" in error
    assert "or --current-topic-incarnation" in error
    assert no_job(imp.engine, imp.db, imp.job)

    # the API refuses the same way: no Incarnation given is no evidence
    source = from_checkpoint(ckpt)
    kafka = KafkaSettings(imp.bootstrap)
    for incarnation in (None, Incarnation.of(source)):
        with pytest.raises(ConfigError, match="--current-topic-incarnation"):
            plan_import(
                store,
                imp.job,
                source.offsets,
                source=source.name,
                kafka=kafka,
                incarnation=incarnation,
            )

    code, out, err = run_cli(*cmd, "--current-topic-incarnation")
    assert code == 0, err
    said = f"topic id {tid}, the current one, on the operator's word (--current-topic-incarnation)"
    assert f"incarnation of {topic}: {said}" in out
    assert audit(imp.engine, imp.db, imp.job)[0][4].endswith(f"[incarnation of {topic}: {said}]")
    assert stored_ids(imp.engine, imp.db, imp.job) == {tid}


def test_a_table_import_needs_a_topic_id_or_the_current_incarnation_flag(
    run_cli: Cli, imp: Importing
) -> None:
    """A legacy table keeps no topic id and no time: without --topic-id or
    --current-topic-incarnation it is a usage error (64) before anything is read; a named id must
    be Kafka's current one; with either the import goes ahead and each audit row says which."""
    topic = imp.topic(2, {0: 10, 1: 10})
    tid = topic_id(imp.bootstrap, topic)
    legacy = f'"{imp.db.schema}".legacy_offsets'
    with imp.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {legacy} (topic text, part int, off bigint)"))
        conn.execute(sa.text(f"INSERT INTO {legacy} VALUES (:t, 0, 4), (:t, 1, 8)"), {"t": topic})
    base = ["offsets", "import", "--job", imp.job, "--schema", imp.db.schema]
    base += ["--from-table", f"{imp.db.schema}.legacy_offsets"]

    code, out, err = run_cli(*base)
    assert (code, out) == (USAGE, "") and err.count("\n") == 1, err
    assert err.startswith("txn-offsets: error: argument --from-table: a table does not say which incarnation")
    assert "add --topic-id TOPIC=ID for each topic" in err and "or --current-topic-incarnation" in err
    for wrong in (
        ["--topic-id", topic],  # no id
        ["--topic-id", f"{topic}=a", "--topic-id", f"{topic}=b"],  # two ids for one topic
        ["--topic-id", f"{topic}={tid}", "--current-topic-incarnation"],  # one or the other
    ):
        code, out, err = run_cli(*base, *wrong)
        assert (code, out) == (USAGE, "") and err.count("\n") == 1, (wrong, err)
    assert no_job(imp.engine, imp.db, imp.job)

    code, out, err = run_cli(*base, "--topic-id", f"{topic}=AAAAAAAAAAAAAAAAAAAAAA")
    error = err.splitlines()[-1]
    assert code == 1 and f"Kafka's {topic} has topic id {tid}" in error, err
    code, out, err = run_cli(*base, "--topic-id", f"{topic}={tid}", "--topic-id", f"elsewhere={tid}")
    error = err.splitlines()[-1]
    assert code == 1 and "names elsewhere, which this import does not take" in error, err
    assert no_job(imp.engine, imp.db, imp.job)

    code, out, err = run_cli(*base, "--topic-id", f"{topic}={tid}")
    assert code == 0, err
    assert f"incarnation of {topic}: topic id {tid} named with --topic-id" in out
    assert offsets_of(imp.engine, imp.db, imp.job) == {(topic, 0): 4, (topic, 1): 8}
    said = f"topic id {tid} named with --topic-id"
    reason = f"import from table {imp.db.schema}.legacy_offsets [incarnation of {topic}: {said}]"
    assert [r[4] for r in audit(imp.engine, imp.db, imp.job)] == [reason, reason]
    assert stored_ids(imp.engine, imp.db, imp.job) == {tid}

    other = f"{imp.job}-current"
    code, out, err = run_cli(*base[:3], other, *base[4:], "--current-topic-incarnation")
    assert code == 0, err
    assert all("(--current-topic-incarnation)]" in r[4] for r in audit(imp.engine, imp.db, other))
    assert stored_ids(imp.engine, imp.db, other) == {tid}


def test_a_consumer_group_is_its_own_evidence_as_kafka_drops_its_offsets_with_the_topic(
    run_cli: Cli, imp: Importing, kafka_admin: AdminClient
) -> None:
    """A group's offsets are imported as before, and the plan and audit say why that is safe; the
    claim itself is checked on the broker: once the topic is deleted and re-created, the group has
    no offsets for it and the import is refused."""
    topic = imp.topic(1, {0: 10})
    tid = topic_id(imp.bootstrap, topic)
    kafka = KafkaSettings(imp.bootstrap)
    group = f"legacy-{uuid.uuid4().hex[:8]}"
    assert GroupMirror(kafka, group).commit({(topic, 0): 7})
    cmd = imp.command("--from-consumer-group", group)

    code, out, err = run_cli(*cmd, "--dry-run")
    assert code == 0, err
    said = f"a consumer group's offsets: Kafka deletes them with their topic (topic id {tid})"
    assert f"incarnation of {topic}: {said}" in out and no_job(imp.engine, imp.db, imp.job)

    recreate_topic(kafka_admin, topic, 1)
    produce_counts(imp.bootstrap, topic, {0: 100})
    deadline = time.monotonic() + 30
    while group_offsets(kafka, group) and time.monotonic() < deadline:
        time.sleep(0.2)  # the group coordinator drops them as it learns of the deletion
    code, out, err = run_cli(*cmd)
    assert code == 1 and "has no committed offsets" in err, err
    assert no_job(imp.engine, imp.db, imp.job)

    assert GroupMirror(kafka, group).commit({(topic, 0): 30})  # committed in the new topic
    code, out, err = run_cli(*cmd)
    assert code == 0, err
    new_said = said.replace(tid, topic_id(imp.bootstrap, topic))
    assert audit(imp.engine, imp.db, imp.job)[0][2:] == (
        30,
        "import",
        f"import from consumer group {group!r} [incarnation of {topic}: {new_said}]",
    )
