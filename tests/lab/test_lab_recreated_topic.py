"""The lagging-leader residual on the lab (marked ``lab``; issue 45 item 3): a broker that still holds a
deleted topic's log answers ListOffsets for the topic re-created under the same name.

Broker X leads partition 0 of topic T (epoch 0, never moved) whose log starts at 20 and ends at 30.
X is cut from the other two brokers (blackhole routes: it stops hearing the metadata log but still
answers clients); T is deleted and created again with X first in its replica list, so before X is
fenced (broker.session.timeout.ms, 9 s) the controller makes X the new partition's leader at epoch 0
again. From the driver host: what X itself answers (:mod:`txn_offsets.kafka.direct`: Metadata v12,
ListOffsets v7 with and without the current leader epoch, Fetch v13 by either topic id), what
librdkafka's admin ListOffsets sends as the current leader epoch (read off the driver's interface),
and the marks the planner takes for a job whose row was stored under the old id
(:func:`txn_offsets.plan.moves._confirmed`): the new log's (0, 0), never the old log's (20, 30) -
with the old log's start a skip would pass over the new topic's first 20 records. Also refused: the
topic "re-created" back to the old id X still describes, and, once X is fenced, a retention skip
for a row already on the new id from X's ListOffsets answer."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.lab.conftest import RunningLab
from txn_offsets.config import KafkaSettings
from txn_offsets.devstack.lab import faults, kafka3, quorum
from txn_offsets.devstack.lab.spawn import entered
from txn_offsets.errors import ServiceUnavailable, TopicChanged
from txn_offsets.kafka import direct, metadata, wire
from txn_offsets.plan import moves
from txn_offsets.plan.data_loss import lost
from txn_offsets.store.offset_rows import StoredOffset

pytestmark = pytest.mark.lab

PORT = kafka3.PORT


def _create(conn: direct.Connection, topic: str, replicas: list[int]) -> int:
    """CreateTopics v5 to the broker `conn` is connected to (it forwards to the active controller):
    partition 0 on `replicas`, first one preferred leader; the topic's error code."""
    assignment = wire.compact_array(
        [struct.pack(">i", 0) + wire.compact_array([struct.pack(">i", b) for b in replicas]) + b"\0"]
    )
    entry = (
        wire.compact_string(topic) + struct.pack(">ih", -1, -1) + assignment + wire.compact_array([]) + b"\0"
    )
    r = conn.ask(19, 5, wire.compact_array([entry]) + struct.pack(">ib", 15_000, 0) + b"\0", flexible=True)
    r.int32()
    r.array()
    r.compact_string()
    return r.int16()


def _delete(conn: direct.Connection, topic: str) -> int:
    """DeleteTopics v4 to the broker `conn` is connected to; the topic's error code."""
    r = conn.ask(
        20,
        4,
        wire.compact_array([wire.compact_string(topic)]) + struct.pack(">i", 15_000) + b"\0",
        flexible=True,
    )
    r.int32()
    r.array()
    r.compact_string()
    return r.int16()


class Sniffer:
    """Every ListOffsets request leaving the driver host's interface (a raw packet socket in its
    namespace): (version, [(partition, current leader epoch, timestamp)])."""

    def __init__(self, lab: RunningLab) -> None:
        self.lab, self.seen = lab, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with entered(self.lab.lab.net, "driver"):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        sock.bind(("eth0", 0))
        sock.settimeout(0.2)
        self.ready.set()
        while not self.stop.is_set():
            try:
                frame = sock.recv(65535)
            except TimeoutError:
                continue
            if frame[12:14] != b"\x08\x00":
                continue
            ip = frame[14:]
            if ip[9] != 6:
                continue
            tcp = ip[(ip[0] & 0x0F) * 4 :]
            if struct.unpack(">H", tcp[2:4])[0] != PORT:
                continue
            payload = tcp[(tcp[12] >> 4) * 4 :]
            if len(payload) > 12 and struct.unpack(">h", payload[4:6])[0] == 2:
                self.seen.append(self._decode(payload))
        sock.close()

    @staticmethod
    def _decode(payload: bytes) -> tuple[int, list[tuple[int, int, int]]]:
        r = wire.Reader(payload[4:])
        r.int16()
        version = r.int16()
        r.int32()
        r.string()
        flexible = version >= 6
        if flexible:
            r.skip_tags()
        r.int32()
        r.int8()
        parts: list[tuple[int, int, int]] = []
        for _ in range(r.array() if flexible else r.int32()):
            r.compact_string() if flexible else r.string()
            for _ in range(r.array() if flexible else r.int32()):
                parts.append((r.int32(), r.int32(), r.int64()))
                if flexible:
                    r.skip_tags()
            if flexible:
                r.skip_tags()
        return version, parts

    @contextmanager
    def running(self) -> Iterator[None]:
        self.thread.start()
        self.ready.wait(5)
        try:
            yield
        finally:
            self.stop.set()
            self.thread.join(5)


def _own(conn_to: direct.Connection, topic: str) -> dict[str, Any]:
    t = direct.metadata(conn_to, [topic]).topics.get(topic)
    if t is None or t.error:
        return {"error": t.error if t else None}
    p = t.partitions.get(0)
    return {"id": t.topic_id, "leader": p.leader if p else None, "epoch": p.leader_epoch if p else None}


def test_a_lagging_leader_never_gives_the_old_logs_marks_for_a_re_created_topic(
    running_lab: RunningLab,
) -> None:
    net = running_lab.lab.net
    kafka_hosts = [h for h in net.hosts if h.role == "kafka"]
    address = {i: h.address for i, h in enumerate(kafka_hosts, 1)}
    name = {i: h.name for i, h in enumerate(kafka_hosts, 1)}
    evidence: dict[str, Any] = {}
    with entered(net, "driver"):
        leader = quorum.describe([(a, kafka3.CONTROLLER_PORT) for a in address.values()]).leader
        x = max(n for n in address if n != leader)  # not the active controller: the quorum stays put
        y, z = (n for n in address if n != x)
        servers = ",".join(f"{a}:{PORT}" for a in address.values())
        kafka = KafkaSettings(servers)
        topic = f"lab-recreated-{uuid.uuid4().hex[:8]}"
        to_y = direct.connect({}, address[y], PORT, 10)
        to_x = direct.connect({}, address[x], PORT, 10)
        assert _create(to_y, topic, [x, y, z]) == 0
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        for i in range(30):
            producer.produce(topic, b"old-%d" % i, partition=0)
        assert producer.flush(60) == 0
        admin = AdminClient({"bootstrap.servers": servers})
        done = admin.delete_records([TopicPartition(topic, 0, 20)])
        next(iter(done.values())).result(30)
        old = _own(to_x, topic)
        assert (old["leader"], old["epoch"]) == (x, 0), old
        assert direct.list_offsets(to_x, topic, {0: 0}, direct.EARLIEST)[0].offset == 20
        isolated_at = faults.isolate(net, name[x], [name[y], name[z]])
        try:
            assert _delete(to_y, topic) == 0
            while _own(to_y, topic).get("id") == old["id"]:
                time.sleep(0.05)
            assert _create(to_y, topic, [x, y, z]) == 0
            while (new := _own(to_y, topic)).get("id") in (None, old["id"]):
                time.sleep(0.05)
            evidence["recreated_s"] = round(time.monotonic() - isolated_at, 2)
            evidence["y_metadata"] = new
            evidence["x_metadata"] = _own(to_x, topic)
            asks = {"epoch_0": {0: 0}, "epoch_unset": {0: -1}}
            evidence["x_list_offsets_v7"] = {
                k: [
                    vars(direct.list_offsets(to_x, topic, ask, spec)[0])
                    for spec in (direct.EARLIEST, direct.LATEST)
                ]
                for k, ask in asks.items()
            }
            evidence["x_fetch_v13_new_id"] = vars(direct.fetch(to_x, new["id"], {0: (0, 0)})[0])
            evidence["x_fetch_v13_old_id"] = vars(direct.fetch(to_x, old["id"], {0: (20, 0)})[0])
            sniffer = Sniffer(running_lab)
            with sniffer.running():
                evidence["librdkafka_watermarks"] = metadata.watermarks(kafka, [(topic, 0)], timeout_s=5)[
                    (topic, 0)
                ]
                time.sleep(0.3)
            evidence["librdkafka_list_offsets_sent"] = sniffer.seen
            evidence["asked_s"] = round(time.monotonic() - isolated_at, 2)
            # the flip: a row already moved to the NEW id, and X describing the topic with its OLD
            # id, as it does to whoever asks it; never "re-created back" to the old log
            moved = StoredOffset(off=0, topic_id=new["id"])
            started = time.monotonic()
            try:
                back = moves._confirmed(
                    kafka,
                    {(topic, 0): moved},
                    [(topic, 0)],
                    {(topic, 0): (20, 30)},
                    {topic: old["id"]},
                    timeout_s=3,
                )
                evidence["flip_marks"] = back[(topic, 0)]
            except (ServiceUnavailable, TopicChanged) as exc:  # refused: nothing moves, planned again
                evidence["flip_refused"] = str(exc)
            evidence["flip_s"] = round(time.monotonic() - started, 2)
            row = StoredOffset(off=25, topic_id=old["id"])
            started = time.monotonic()
            marks = moves._confirmed(
                kafka,
                {(topic, 0): row},
                [(topic, 0)],
                {(topic, 0): (20, 30)},
                {topic: new["id"]},
                timeout_s=30,
            )
            evidence["planner_marks"] = marks[(topic, 0)]
            evidence["planner_s"] = round(time.monotonic() - started, 2)
            evidence["skip_to"] = lost(row, new["id"], marks[(topic, 0)])
            # X fenced now, the leader moved; X, still cut off, answers ListOffsets from the old log to
            # whoever asks it (librdkafka does when its metadata came from X): for a row already on
            # the new id that is "retention" - a skip to 20 - unless the marks are confirmed
            stale = [
                direct.list_offsets(to_x, topic, {0: -1}, spec)[0]
                for spec in (direct.EARLIEST, direct.LATEST)
            ]
            evidence["x_fenced_list_offsets"] = [(a.error, a.offset) for a in stale]
            moved = StoredOffset(off=0, topic_id=new["id"])
            stale_marks = {(topic, 0): (stale[0].offset, stale[1].offset)}
            again = moves._confirmed(
                kafka, {(topic, 0): moved}, [(topic, 0)], stale_marks, {topic: new["id"]}, timeout_s=10
            )
            evidence["retention_marks"] = again[(topic, 0)]
        finally:
            faults.rejoin(net, name[x])
            evidence["after_heal_y"] = _own(to_y, topic)
            evidence["deleted"] = _delete(to_y, topic)
            to_x.close()
            to_y.close()
            print("\n" + json.dumps(evidence, default=str))
    # what X answered (Kafka 4.1.1, librdkafka 2.16): ListOffsets v7 from the old log whatever the
    # current leader epoch said; Fetch v13 by the new id UNKNOWN_TOPIC_ID; librdkafka sent epoch 0
    assert evidence["x_metadata"]["id"] == old["id"] and evidence["y_metadata"]["id"] == new["id"]
    for answers in evidence["x_list_offsets_v7"].values():
        assert [(a["error"], a["offset"]) for a in answers] == [(0, 20), (0, 30)], evidence
    assert evidence["x_fetch_v13_new_id"]["error"] == 100, evidence
    assert {(v, p[0][1]) for v, p in evidence["librdkafka_list_offsets_sent"]} == {(7, 0)}, evidence
    assert "flip_marks" not in evidence and "flip_refused" in evidence, evidence
    assert evidence["planner_marks"] == (0, 0), evidence
    assert evidence["x_fenced_list_offsets"] == [(0, 20), (0, 30)], evidence
    assert evidence["retention_marks"] == (0, 0), evidence
    assert evidence["skip_to"] is not None and evidence["skip_to"][1] == 0, evidence
