"""A run's driver Store kept for the process's next run (txn_offsets.store.kept.run_store): the
next run on the same settings starts on the connections the last one left open (none opened); a
run that failed leaves nothing open; a kept engine no run takes within KEEP_S is closed
(its connections gone from the server); one whose connections the server dropped meanwhile is
replaced, and the next run starts as if nothing was kept."""

from __future__ import annotations

import atexit
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.spark.spec import JobSpec, job_run
from txn_offsets.store import kept as keeping
from txn_offsets.store.handle import Store


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    keeping.close_kept_stores()
    yield
    keeping.close_kept_stores()


def _spec(topic: str) -> JobSpec:
    return JobSpec(job=f"kept-{uuid.uuid4().hex[:8]}", selection=TopicSelection((topic,), None))


def _tagged(db: DatabaseSettings) -> tuple[DatabaseSettings, str]:
    """The same settings, every connection of them named in pg_stat_activity by a name of its own."""
    name = f"kept-{uuid.uuid4().hex[:10]}"
    url = sa.engine.make_url(db.url).update_query_dict({"application_name": name})
    return dataclasses.replace(db, url=url.render_as_string(hide_password=False)), name


def _on_server(engine: sa.Engine, name: str) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :n"), {"n": name}
        )
        return [int(r.pid) for r in rows]


def _connects(engine: sa.Engine) -> list[object]:
    """Every new connection `engine` opens from now on."""
    opened: list[object] = []
    sa.event.listen(engine, "connect", lambda conn, _record: opened.append(conn))
    return opened


@pytest.fixture
def topic(topic_factory: Callable[..., str]) -> str:
    return topic_factory(partitions=1)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(kafka_bootstrap)


def _run(spec: JobSpec, db: DatabaseSettings, kafka: KafkaSettings) -> tuple[sa.Engine, int]:
    """One run that ends cleanly: its driver engine and generation."""
    with job_run(spec, db, kafka) as (store, run):
        return store.engine, run.generation


def test_the_next_run_starts_on_the_connections_the_last_one_left(
    migrated: DatabaseSettings, kafka: KafkaSettings, topic: str, engine: sa.Engine
) -> None:
    db, name = _tagged(migrated)
    spec = _spec(topic)
    first, generation = _run(spec, db, kafka)
    assert generation == 1
    left = _on_server(engine, name)
    assert len(left) >= 1, "the run's connection was closed, not kept"
    opened = _connects(first)
    assert _run(spec, db, kafka) == (first, 2)  # a new run of the same job, fencing the first
    assert _run(_spec(topic), db, kafka) == (first, 1)  # another job, the same settings
    assert opened == [], "a later run opened a connection of its own"
    assert sorted(_on_server(engine, name)) == sorted(left)
    other, other_name = _tagged(migrated)  # other settings: an engine of their own
    assert _run(_spec(topic), other, kafka)[0] is not first
    keeping.close_kept_stores()
    assert _until_gone(engine, name, 10) == [] and _until_gone(engine, other_name, 10) == []


def test_a_failed_run_leaves_nothing_open(
    migrated: DatabaseSettings, kafka: KafkaSettings, topic: str, engine: sa.Engine
) -> None:
    db, name = _tagged(migrated)
    with (
        pytest.raises(RuntimeError, match="the job's own error"),
        job_run(_spec(topic), db, kafka) as (store, _),
    ):
        failed = store.engine
        raise RuntimeError("the job's own error")
    # a closed connection's backend leaves pg_stat_activity soon after, not at once
    assert _until_gone(engine, name, 10) == []
    later, generation = _run(_spec(topic), db, kafka)
    assert later is not failed and generation == 1


def test_an_engine_no_run_takes_is_closed(
    migrated: DatabaseSettings,
    kafka: KafkaSettings,
    topic: str,
    engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keeping, "KEEP_S", 0.3)
    db, name = _tagged(migrated)
    kept, _ = _run(_spec(topic), db, kafka)
    assert _on_server(engine, name) != []
    assert _until_gone(engine, name, 15) == [], "the kept engine's connections outlived KEEP_S"
    assert _run(_spec(topic), db, kafka)[0] is not kept


def test_a_kept_engine_whose_connections_died_is_replaced(
    migrated: DatabaseSettings, kafka: KafkaSettings, topic: str, engine: sa.Engine
) -> None:
    db, name = _tagged(migrated)
    spec = _spec(topic)
    kept, _ = _run(spec, db, kafka)
    with engine.connect() as conn:  # what a server restart does to them
        for pid in _on_server(engine, name):
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        conn.commit()
    _until_gone(engine, name, 10)
    # at once: well within PING_IF_IDLE_S, when a pooled connection is not pinged before use
    assert _run(spec, db, kafka)[0] is not kept
    assert _run(spec, db, kafka)[1] == 3


def _until_gone(engine: sa.Engine, name: str, timeout_s: float) -> list[int]:
    """The backends of `name` still on the server once none is left or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while (left := _on_server(engine, name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_keeping_engines_adds_nothing_to_do_at_exit(migrated: DatabaseSettings) -> None:
    """A process running thousands of runs: each kept engine replaces the last, closed at once,
    and nothing more is registered at exit than one closing of what is kept."""
    before = atexit._ncallbacks()
    stores = [Store.of(migrated) for _ in range(3)]
    for store in stores:
        keeping.release_run_store(store, clean=True)
    assert atexit._ncallbacks() == before
    assert keeping.run_store(migrated) is stores[-1]
    stores[-1].engine.dispose()
