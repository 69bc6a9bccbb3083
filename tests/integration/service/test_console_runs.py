"""How each run ended, as the store records it (``job_runs``, migration 0013) and the console's job page
says it: finished, failed (the error's class; a txn_offsets error's first line, never another
error's message), fenced by a newer run or by an audited reset (its actor and reason), its holder's
process gone (killed), its lease expired. Real PostgreSQL; the moves are the store's and the CLI's."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.integration.helpers import Cli
from txn_offsets.admin.console_views import RunRow, runs_of
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import BatchFailed, OffsetConflict
from txn_offsets.store.handle import Store
from txn_offsets.store.holders import process_of
from txn_offsets.store.run_ends import note_failure
from txn_offsets.store.runs import Run, end_run, start_run

PAYLOAD = "card=4111-1111-1111-1111"  # what a user's error message may hold: never stored


def _ends(store: Store, job: str) -> dict[str, RunRow]:
    return {r.run_id: r for r in runs_of(store, job)}


def _stored(engine: sa.Engine, db: DatabaseSettings, run: Run) -> Any:
    r = Store(engine, db).tables.runs
    with engine.connect() as conn:
        return conn.execute(
            sa.select(r.c.ended, r.c.ended_by_generation, r.c.ended_by_run, r.c.error_class, r.c.cause).where(
                r.c.job == run.job, r.c.generation == run.generation
            )
        ).one()


def test_each_end_is_recorded(
    engine: sa.Engine, migrated: DatabaseSettings, run_cli: Cli, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=1)
    store = Store(engine, migrated)
    job = f"ends-{uuid.uuid4().hex[:8]}"
    finished = start_run(store, job, lease_s=600)
    assert _ends(store, job)[finished.run_id].ended == "running (lease live)"
    assert end_run(store, finished)

    failed = start_run(store, job, lease_s=600)
    note_failure(store, failed, OffsetConflict(job, topic, 0, 4, 9))  # a message of the store's facts
    assert end_run(store, failed)  # released after the note: it stays failed

    foreign = start_run(store, job, lease_s=600)
    try:  # a user's error inside a batch: its text may quote records, so the classes only
        try:
            raise ValueError(PAYLOAD)
        except ValueError as exc:
            raise BatchFailed(job, 3, str(exc)) from exc
    except BatchFailed as exc:
        note_failure(store, foreign, exc)

    forced = start_run(store, job, lease_s=600, force=True)  # `foreign` stays failed (noted first)
    fenced_by_run = start_run(store, job, lease_s=600, force=True)  # fences `forced`, live

    code, _out, err = run_cli(
        "offsets", "reset", "--job", job, "--topic", topic, "--partition", "0", "--to-offset", "0",
        "--reason", "operator's <b>replay</b>", "--force", "--schema", migrated.schema,
    )  # fmt: skip
    assert code == 0, err  # fences `fenced_by_run`, live

    expired = start_run(store, job, lease_s=0.2)
    time.sleep(0.5)
    after_expiry = start_run(store, job, lease_s=600)  # its lease ran out: no force needed

    # a holder on this host whose process is gone (killed): the next start takes the job over
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = process_of(child.pid)
    child.kill()
    child.wait()
    t = store.tables.jobs
    with engine.begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.job == job).values(run_host=socket.gethostname(), run_process=dead)
        )
    takeover = start_run(store, job, lease_s=600)

    ends = _ends(store, job)
    assert ends[finished.run_id].ended == "finished (lease released)"
    told = str(OffsetConflict(job, topic, 0, 4, 9)).splitlines()[0]
    assert ends[failed.run_id].ended == f"failed: OffsetConflict: {told}"
    assert ends[foreign.run_id].ended == "failed: BatchFailed: caused by ValueError"
    assert (
        ends[forced.run_id].ended
        == f"fenced by generation {fenced_by_run.generation} (run {fenced_by_run.run_id})"
    )
    reset_generation = fenced_by_run.generation + 1
    assert ends[fenced_by_run.run_id].ended == (
        f"fenced by generation {reset_generation} "
        f"(reset by {_actor(engine, migrated, job)}: operator's <b>replay</b>)"
    )
    assert ends[expired.run_id].ended.startswith("lease expired (the driver stopped without ending it); then")
    assert ends[expired.run_id].ended.endswith(f"(run {after_expiry.run_id})")
    assert ends[after_expiry.run_id].ended == (
        f"its process was gone (killed or crashed): taken over by generation {takeover.generation} "
        f"(run {takeover.run_id})"
    )
    assert ends[takeover.run_id].ended == "running (lease live)"
    assert [r.generation for r in runs_of(store, job)] == sorted(
        (r.generation for r in ends.values()), reverse=True
    )
    stored = _stored(engine, migrated, foreign)
    assert (stored.ended, stored.error_class, stored.cause) == (
        "failed",
        "BatchFailed",
        "caused by ValueError",
    )
    with engine.connect() as conn:  # the user's message is nowhere in the table
        rows = conn.execute(
            sa.text(f'SELECT count(*) FROM "{migrated.schema}".job_runs r WHERE r::text LIKE :p'),
            {"p": f"%{PAYLOAD}%"},
        )
        assert rows.scalar_one() == 0


def _actor(engine: sa.Engine, db: DatabaseSettings, job: str) -> str:
    a = Store(engine, db).tables.audit
    with engine.connect() as conn:
        return str(
            conn.execute(sa.select(a.c.actor).where(a.c.job == job, a.c.action == "reset")).scalar_one()
        )


def test_a_job_page_says_how_runs_ended(engine: sa.Engine, migrated: DatabaseSettings) -> None:
    """The job page's runs table shows the recorded end (escaped), not the old inference."""
    from starlette.testclient import TestClient

    from txn_offsets.config import KafkaSettings
    from txn_offsets.service.app import Service, create_app
    from txn_offsets.service.kafka_view import KafkaView

    store = Store(engine, migrated)
    job = f"page-ends-{uuid.uuid4().hex[:8]}"
    first = start_run(store, job, lease_s=600)
    note_failure(store, first, OffsetConflict(job, "t", 0, 1, 2))
    end_run(store, first)
    second = start_run(store, job, lease_s=600)
    note_failure(store, second, BatchFailed(job, 1, f"<script>{PAYLOAD}</script>"))
    end_run(store, second)
    service = Service(store, KafkaView(KafkaSettings("127.0.0.1:9"), ttl_s=0), None)
    try:
        with TestClient(create_app(service), base_url="http://127.0.0.1") as client:
            page = client.get(f"/console/jobs/{job}").text
    finally:
        service.close()
    assert "failed: OffsetConflict: " in page and "failed: BatchFailed</td>" in page
    assert PAYLOAD not in page and "<script>" not in page
