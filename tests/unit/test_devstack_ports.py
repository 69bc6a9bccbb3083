"""The embedded stack's ports are chosen once each, and never one already chosen: the kernel may
hand out the same free port twice in a row, and two Kafka listeners on one port fail the broker's
start ("formatting the KRaft storage failed", seen once in CI)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from txn_offsets import devstack
from txn_offsets.devstack import Stack
from txn_offsets.devstack.kafka import _java_failure


def test_a_port_handed_out_twice_is_not_chosen_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("PG", "KAFKA", "KAFKA_CONTROLLER", "PGBOUNCER", "REPLICA", "KAFKA_SASL"):
        monkeypatch.delenv(f"TXN_OFFSETS_{env}_PORT", raising=False)
    handed = itertools.chain(
        [41000, 41000, 41000, 41001, 41001, 41002, 41002, 41002, 41003], itertools.count(42000)
    )
    monkeypatch.setattr(devstack, "pick_free_port", lambda: next(handed))
    state = Stack(tmp_path)._state(pooler="pgbouncer", tls_on=True)
    ports = [v for k, v in state.items() if k.endswith("_port")]
    assert len(ports) == 5 and len(set(ports)) == 5, state
    assert json.loads((tmp_path / "state.json").read_text())["kafka_port"] == state["kafka_port"]


def test_a_failed_kafka_tool_shows_its_exception_message() -> None:
    out = (
        "java.lang.IllegalArgumentException: requirement failed: Each listener must have a different port\n"
        + ("\tat kafka.utils.CoreUtils$.listenerListToEndPoints(CoreUtils.scala:193)\n" * 20)
    )
    shown = _java_failure(out)
    assert shown.startswith("java.lang.IllegalArgumentException: requirement failed: Each listener")
    assert shown.endswith("(CoreUtils.scala:193)")
