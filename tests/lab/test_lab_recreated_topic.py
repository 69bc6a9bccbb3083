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
for a row already on the new id from X's ListOffsets answer.

Where nothing moves (a row already on the new id at 0, X's old log (0, 30)): what librdkafka's
consumer sends (Fetch version, topic id, broker: read off the driver's interface), the records the
task's reader (:func:`read_ranges`) gets, and the commit's proof (:func:`check_incarnation`): the
old log's records are never proven the new topic's. And once X rejoins and catches up, the proof
alone would pass them: the planner's barrier (:func:`recreated.settle`) hands no range out while X
names the old id."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.lab.conftest import RunningLab
from txn_offsets.commit.proof import check_incarnation
from txn_offsets.config import KafkaSettings
from txn_offsets.devstack.lab import faults, kafka3, quorum
from txn_offsets.devstack.lab.spawn import entered
from txn_offsets.errors import KafkaReadError, ServiceUnavailable, TopicChanged
from txn_offsets.kafka import direct, metadata, reader, recreated, wire
from txn_offsets.kafka.reader import read_ranges
from txn_offsets.plan import moves
from txn_offsets.plan.data_loss import lost
from txn_offsets.ranges import OffsetRange
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
    namespace): (version, [(partition, current leader epoch, timestamp)]); every Fetch request:
    (broker address, version, [(topic id, partition, current leader epoch, offset)]); the broker
    address of every Metadata request."""

    def __init__(self, lab: RunningLab) -> None:
        self.lab, self.seen = lab, []  # type: ignore[var-annotated]
        self.fetches: list[tuple[str, int, list[tuple[str | None, int, int, int]]]] = []
        self.metadata_to: list[str] = []  # the broker each Metadata request went to
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
            if len(payload) <= 12:
                continue
            api_key = struct.unpack(">h", payload[4:6])[0]
            if api_key == 2:
                self.seen.append(self._decode(payload))
            elif api_key == 1:
                self.fetches.append((socket.inet_ntoa(ip[16:20]), *self._decode_fetch(payload)))
            elif api_key == 3:
                self.metadata_to.append(socket.inet_ntoa(ip[16:20]))
        sock.close()

    @staticmethod
    def _decode_fetch(payload: bytes) -> tuple[int, list[tuple[str | None, int, int, int]]]:
        """A Fetch request v12+ (librdkafka's): (version, [(topic id from v13 on, else name,
        partition, current leader epoch, fetch offset)])."""
        r = wire.Reader(payload[4:])
        r.int16()
        version = r.int16()
        r.int32()
        r.string()
        r.skip_tags()
        if version < 12:
            return version, []
        if version < 15:
            r.int32()  # replica id
        r.int32()
        r.int32()
        r.int32()
        r.int8()
        r.int32()
        r.int32()
        parts: list[tuple[str | None, int, int, int]] = []
        for _ in range(r.array()):
            topic = r.uuid() if version >= 13 else r.compact_string()
            for _ in range(r.array()):
                index, epoch, offset = r.int32(), r.int32(), r.int64()
                r.int32()
                r.int64()
                r.int32()
                r.skip_tags()
                parts.append((topic, index, epoch, offset))
            r.skip_tags()
        return version, parts

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


@dataclass
class Lagging:
    """Topic T re-created while its old partition-0 leader X is cut from the other brokers."""

    kafka: KafkaSettings
    topic: str
    x: int
    to_x: direct.Connection
    to_y: direct.Connection
    old: dict[str, Any]
    new: dict[str, Any]
    isolated_at: float
    evidence: dict[str, Any]


@contextmanager
def _lagging_leader(running_lab: RunningLab, records: int, deleted_to: int) -> Iterator[Lagging]:
    """T (partition 0 on [X, Y, Z], X the leader at epoch 0, not the active controller) with
    `records` records, those before `deleted_to` deleted; X cut off, T deleted and created again on
    [X, Y, Z], in the driver host's namespace; X rejoined and T deleted on leaving."""
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
        waited = time.monotonic()  # X back and unfenced (a test before may have cut it off)
        while x not in direct.metadata(to_y, []).brokers:
            assert time.monotonic() - waited < 60, f"broker {x} not listed by broker {y} after 60s"
            time.sleep(0.2)
        assert _create(to_y, topic, [x, y, z]) == 0
        while _own(to_x, topic).get("leader") != x:
            assert time.monotonic() - waited < 60, f"broker {x} does not lead {topic} after 60s"
            time.sleep(0.1)
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        for i in range(records):
            producer.produce(topic, b"old-%d" % i, partition=0)
        assert producer.flush(60) == 0
        if deleted_to:
            admin = AdminClient({"bootstrap.servers": servers})
            done = admin.delete_records([TopicPartition(topic, 0, deleted_to)])
            next(iter(done.values())).result(30)
        old = _own(to_x, topic)
        assert (old["leader"], old["epoch"]) == (x, 0), old
        assert direct.list_offsets(to_x, topic, {0: 0}, direct.EARLIEST)[0].offset == deleted_to
        isolated_at = faults.isolate(net, name[x], [name[y], name[z]])
        try:
            assert _delete(to_y, topic) == 0
            while _own(to_y, topic).get("id") == old["id"]:
                time.sleep(0.05)
            assert _create(to_y, topic, [x, y, z]) == 0
            while (new := _own(to_y, topic)).get("id") in (None, old["id"]):
                time.sleep(0.05)
            evidence["x"] = x
            evidence["addresses"] = address
            evidence["recreated_s"] = round(time.monotonic() - isolated_at, 2)
            evidence["y_metadata"] = new
            evidence["x_metadata"] = _own(to_x, topic)
            yield Lagging(kafka, topic, x, to_x, to_y, old, new, isolated_at, evidence)
        finally:
            faults.rejoin(net, name[x])
            evidence["after_heal_y"] = _own(to_y, topic)
            evidence["deleted"] = _delete(to_y, topic)
            to_x.close()
            to_y.close()
            print("\n" + json.dumps(evidence, default=str))


def test_a_lagging_leader_never_gives_the_old_logs_marks_for_a_re_created_topic(
    running_lab: RunningLab,
) -> None:
    with _lagging_leader(running_lab, 30, 20) as lag:
        kafka, topic, to_x, old, new = lag.kafka, lag.topic, lag.to_x, lag.old, lag.new
        evidence, isolated_at = lag.evidence, lag.isolated_at
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
            direct.list_offsets(to_x, topic, {0: -1}, spec)[0] for spec in (direct.EARLIEST, direct.LATEST)
        ]
        evidence["x_fenced_list_offsets"] = [(a.error, a.offset) for a in stale]
        moved = StoredOffset(off=0, topic_id=new["id"])
        stale_marks = {(topic, 0): (stale[0].offset, stale[1].offset)}
        again = moves._confirmed(
            kafka, {(topic, 0): moved}, [(topic, 0)], stale_marks, {topic: new["id"]}, timeout_s=10
        )
        evidence["retention_marks"] = again[(topic, 0)]
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


def test_a_lagging_leaders_old_records_are_never_proven_the_new_topics(
    running_lab: RunningLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing moves: a row already on the new id at offset 0, X's old log (0, 30) never deleted
    from. The plan's marks (librdkafka ListOffsets) and id (describe), the task's read
    (:func:`read_ranges`) and the commit's proof (:func:`check_incarnation`), each as the product
    asks them, while X is cut off: records read from the old log must never pass the proof."""
    with _lagging_leader(running_lab, 30, 0) as lag:
        kafka, topic, evidence = lag.kafka, lag.topic, lag.evidence
        sniffer = Sniffer(running_lab)
        with sniffer.running():
            started = time.monotonic()
            evidence["plan_marks"] = metadata.watermarks(kafka, [(topic, 0)], timeout_s=5)[(topic, 0)]
            evidence["plan_id"] = metadata.describe_topics(kafka, [topic])[topic].topic_id
            rng = OffsetRange(topic, 0, 0, evidence["plan_marks"][1], lag.new["id"])
            _read_with_and_without_the_barrier(monkeypatch, kafka, rng, evidence)
            evidence["read_s"] = round(time.monotonic() - started, 2)
            proofs = []
            for _ in range(6):
                try:
                    check_incarnation(kafka, [rng])
                    proofs.append("proven")
                except TopicChanged as exc:
                    proofs.append(f"refused: {exc}")
            evidence["proofs"] = proofs
            evidence["proof_s"] = round(time.monotonic() - lag.isolated_at, 2)
            time.sleep(0.3)
        evidence["fetches_sent"] = sniffer.fetches
        evidence["metadata_to"] = sniffer.metadata_to
    # what happened (Kafka 4.1.1, librdkafka 2.16): the reader's Fetch v16 went to X by the old id
    # (its metadata from X; or by the new id first, UNKNOWN_TOPIC_ID, then X's old id) and got the
    # old log's 30 records at the planned offsets; before the every-broker proof, 5 of 6 proofs
    # passed them as the new topic's (one broker described the new id): a commit of them
    assert [v for _, v in evidence.get("read", [])] == ["old-"] * 30, evidence
    assert (16, lag.old["id"]) in {(v, p[0][0]) for _, v, p in evidence["fetches_sent"]}, evidence
    assert evidence["proofs"] and all(p.startswith("refused") for p in evidence["proofs"]), evidence
    # and the reader, asked as the product asks it, reads nothing while X names the old id
    assert evidence["reader_barrier"].startswith("refused") and lag.old["id"] in evidence["reader_barrier"]


def test_a_plan_is_held_back_until_the_lagging_broker_has_caught_up(
    running_lab: RunningLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rest of the hole the proof leaves: X catches up between the read and the proof. Nothing
    moves (a row on the new id at 0, X's old log (0, 30)). With the pieces as they ran before the
    plan's barrier: the read gets X's old records; X rejoins and applies the deletion and the new
    topic; the proof, asked then, passes them (every broker names the new id). The planner's barrier
    (:func:`recreated.settle`, what :func:`plan_batch` calls before handing out ranges) refuses while
    X names the old id, and once X caught up the marks it plans from are the new log's (0, 0)."""
    with _lagging_leader(running_lab, 30, 0) as lag:
        kafka, topic, evidence = lag.kafka, lag.topic, lag.evidence
        new_id = lag.new["id"]
        marks = metadata.watermarks(kafka, [(topic, 0)], timeout_s=5)[(topic, 0)]
        evidence["plan_marks"] = marks
        rng = OffsetRange(topic, 0, 0, marks[1], new_id)
        started = time.monotonic()
        try:
            recreated.settle(kafka, {topic: new_id}, timeout_s=3)
            evidence["barrier_lagging"] = "handed out"
        except ServiceUnavailable as exc:
            evidence["barrier_lagging"] = f"refused: {exc.detail}"
        evidence["barrier_lagging_s"] = round(time.monotonic() - started, 2)
        _read_with_and_without_the_barrier(monkeypatch, kafka, rng, evidence)
        faults.rejoin(running_lab.lab.net, _host_of(running_lab, lag.x))
        healed = time.monotonic()
        while _own(lag.to_x, topic).get("id") != new_id:
            assert time.monotonic() - healed < 60, f"broker {lag.x} did not catch up within 60s"
            time.sleep(0.1)
        evidence["caught_up_s"] = round(time.monotonic() - healed, 2)
        try:
            check_incarnation(kafka, [rng])
            evidence["proof_after_catch_up"] = "proven"
        except TopicChanged as exc:
            evidence["proof_after_catch_up"] = f"refused: {exc}"
        recreated.settle(kafka, {topic: new_id}, timeout_s=30)  # X caught up: handed out
        evidence["marks_after"] = metadata.watermarks(kafka, [(topic, 0)], timeout_s=5)[(topic, 0)]
    # without the barrier: the old log's 30 records read at the planned offsets, then proven the new
    # topic's once X had caught up - a commit of them
    assert [v for _, v in evidence.get("read", [])] == ["old-"] * 30, evidence
    assert evidence["proof_after_catch_up"] == "proven", evidence
    # with it: no range of that plan is handed out while X names the old id
    assert evidence["barrier_lagging"].startswith("refused"), evidence
    assert lag.old["id"] in evidence["barrier_lagging"], evidence
    assert evidence["reader_barrier"].startswith("refused"), evidence  # a task's read too
    assert evidence["marks_after"] == (0, 0), evidence


def _read_with_and_without_the_barrier(
    monkeypatch: pytest.MonkeyPatch, kafka: KafkaSettings, rng: OffsetRange, evidence: dict[str, Any]
) -> None:
    """`rng` read as the product reads it now (its barrier waits 3 s here, 10 s in a task): evidence
    "reader_barrier"; then as the reader read before its barrier: "read" (offset, first 4 bytes of
    each record) or "read_error"."""
    with monkeypatch.context() as short:
        short.setattr(reader, "SETTLE_TIMEOUT_S", 3.0)
        try:
            got = read_ranges(kafka, [rng], stall_timeout_s=5)[(rng.topic, rng.partition)]
            evidence["reader_barrier"] = f"read {len(got)} records"
        except ServiceUnavailable as exc:
            evidence["reader_barrier"] = f"refused: {exc.detail}"
    with monkeypatch.context() as before:
        before.setattr(reader, "_settle", lambda kafka, ranges: None)
        try:
            got = read_ranges(kafka, [rng], stall_timeout_s=5)[(rng.topic, rng.partition)]
            evidence["read"] = [(r.offset, (r.value or b"")[:4].decode()) for r in got]
        except KafkaReadError as exc:
            evidence["read_error"] = str(exc)


def _host_of(running_lab: RunningLab, broker: int) -> str:
    """The lab host name of Kafka broker `broker` (1-based, in the lab's order)."""
    return [h.name for h in running_lab.lab.net.hosts if h.role == "kafka"][broker - 1]
