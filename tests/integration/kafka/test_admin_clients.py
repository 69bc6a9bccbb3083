"""The process's AdminClients (txn_offsets.kafka.admins): planning survives a topic deleted and
created again under it, and a retired client is destroyed only once nothing uses it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka import admins

ROOT = Path(__file__).resolve().parents[3]


def test_planning_from_threads_survives_a_topic_recreated_under_it(kafka_bootstrap: str) -> None:
    """Before: the process aborted within seconds (a client retired for an answer - "no leader" -
    and destroyed by the GC in a librdkafka thread; a double free in librdkafka with DescribeTopics
    and ListOffsets in flight on one client while the topic was re-created)."""
    topic = "recreated-" + uuid.uuid4().hex[:10]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.recreate_stress", kafka_bootstrap, topic, "12", "2", "0"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    fields = dict(kv.split("=") for kv in done.stdout.split())
    assert int(fields["recreated"]) >= 5 and int(fields["calls"]) > 100  # it really overlapped
    assert int(fields["errors"]) < int(fields["calls"])  # and planned between the re-creations
    assert fields["kept"] == "0"  # answers retire no client


def _retired_ids() -> set[int]:
    """ids of the clients retired and not yet destroyed (other tests' too: counts would race)."""
    return {id(r.admin) for r in admins._state.retired}


def test_a_retired_client_is_kept_while_used_and_destroyed_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admins, "FIRST_CONTACT_S", 0.5)
    nobody = KafkaSettings("127.0.0.1:9")  # discard port: nothing answers
    held = admins.admin_client(nobody)
    first = id(held)
    with pytest.raises(ServiceUnavailable, match=r"cannot reach Kafka at 127\.0\.0\.1:9: "):
        admins.connected_admin(nobody, timeout_s=5)  # retires it (Kafka did not answer)
    fresh = admins.admin_client(nobody)
    assert fresh is not held and first in _retired_ids()  # the next call gets a fresh client
    time.sleep(admins.RETIRED_GRACE_S + 0.2)
    admins.reap()
    assert first in _retired_ids()  # still referenced here: kept, not destroyed
    del held
    gc.collect()  # the error's traceback held the client too (frames in a cycle)
    admins.reap()
    assert first not in _retired_ids()  # nobody uses it any more: destroyed, in this thread
    second = id(fresh)
    del fresh
    admins.forget_admin_client(nobody)
    admins.reap()
    assert second in _retired_ids()  # within its grace period
    time.sleep(admins.RETIRED_GRACE_S + 0.2)
    admins.reap()
    assert second not in _retired_ids()


def test_a_client_role_must_be_known() -> None:
    with pytest.raises(ValueError, match="one of metadata, offsets, groups"):
        admins.client_key(KafkaSettings("127.0.0.1:9"), "other")
