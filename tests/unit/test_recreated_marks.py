"""A re-created topic's marks are taken only from a Fetch answered for its new topic id
(:func:`txn_offsets.kafka.recreated.confirm`) by a leader every live broker agrees on
(:func:`txn_offsets.kafka.recreated.leader_for`: a lagging broker, still on the old id, is never
it, and blocks the choice until the others stop listing it); the requests that ask them are written
as Kafka reads them (:mod:`txn_offsets.kafka.direct` over :mod:`txn_offsets.kafka.wire`, checked
field by field against Kafka 4.1's FetchRequest v13 and ListOffsetsRequest v7 schemas, and against a
broker's answer replayed from a socket pair)."""

from __future__ import annotations

import socket
import struct
import threading

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.kafka import direct, wire
from txn_offsets.kafka.recreated import View, confirm, leader_for

OFFSETS = st.integers(min_value=-1, max_value=2**40)
# what broker X answered on the lab for the re-created topic's new id (tests/lab/test_lab_recreated_topic.py)
UNKNOWN_TOPIC_ID = 100


@given(
    error=st.integers(min_value=-1, max_value=120).filter(lambda e: e != 0),
    high=OFFSETS,
    stable=OFFSETS,
    start=OFFSETS,
    committed=st.booleans(),
)
def test_an_error_answer_gives_no_marks(
    error: int, high: int, stable: int, start: int, committed: bool
) -> None:
    got = confirm(direct.FetchAnswer(error, high, stable, start), read_committed=committed)
    assert isinstance(got, str) and got


@given(start=OFFSETS, high=OFFSETS, stable=OFFSETS, committed=st.booleans())
def test_an_answer_for_the_id_gives_its_own_log_start_and_end_at_the_readers_level(
    start: int, high: int, stable: int, committed: bool
) -> None:
    got = confirm(direct.FetchAnswer(0, high, stable, start), read_committed=committed)
    end = stable if committed else high
    if 0 <= start <= end:
        assert got == (start, end)
    else:
        assert isinstance(got, str) and "out of order" in got


def test_the_lagging_leaders_answer_names_the_unknown_id() -> None:
    assert (
        confirm(direct.FetchAnswer(UNKNOWN_TOPIC_ID, -1, -1, -1), read_committed=True) == "UNKNOWN_TOPIC_ID"
    )


NEW, OLD = "new-id", "old-id"
BROKERS = (1, 2, 3, 4)


@st.composite
def views(draw: st.DrawFn) -> dict[int, View | None]:
    out: dict[int, View | None] = {}
    for broker in BROKERS:
        if draw(st.integers(0, 9)) == 0:
            out[broker] = None  # did not answer
            continue
        topic_id = draw(st.sampled_from([NEW, NEW, NEW, OLD, None]))
        leader = (draw(st.sampled_from(BROKERS)), draw(st.integers(0, 2)))
        listed = frozenset(draw(st.sets(st.sampled_from(BROKERS))) | {broker})
        out[broker] = View(topic_id, {0: leader} if topic_id else {}, listed)
    return out


@given(views())
def test_a_leader_is_chosen_only_when_every_broker_listed_by_all_names_the_id_and_it(
    got: dict[int, View | None],
) -> None:
    choice = leader_for(got, 0, NEW)
    answered = {b: v for b, v in got.items() if v is not None}
    voters = {b: v for b, v in answered.items() if all(b in w.listed for w in answered.values())}
    if isinstance(choice, str):
        assert choice
        return
    leader, epoch = choice
    own = got[leader]
    assert own is not None and own.topic_id == NEW and own.leaders[0] == (leader, epoch)
    assert voters and all(v.topic_id == NEW and v.leaders[0] == choice for v in voters.values())
    assert all(got.get(b) is not None for v in voters.values() for b in v.listed)


def test_the_fenced_lagging_broker_is_outvoted_only_once_the_others_stop_listing_it() -> None:
    # the lab's broker X (3): cut off, still leader of the old log at epoch 0 in its own view
    x = View(OLD, {0: (3, 0)}, frozenset({1, 2, 3}))
    before = {
        1: View(NEW, {0: (3, 0)}, frozenset({1, 2, 3})),
        2: View(NEW, {0: (3, 0)}, frozenset({1, 2, 3})),
    }
    assert leader_for({**before, 3: x}, 0, NEW) == "broker 3 has topic id old-id"
    assert leader_for({**before, 3: x}, 0, OLD) == "broker 1 has topic id new-id"  # the flip back
    fenced = {1: View(NEW, {0: (1, 1)}, frozenset({1, 2})), 2: View(NEW, {0: (1, 1)}, frozenset({1, 2}))}
    assert leader_for({**fenced, 3: x}, 0, NEW) == (1, 1)
    assert leader_for({**fenced, 3: x}, 0, OLD) == "broker 1 has topic id new-id"
    assert leader_for({**fenced, 3: None}, 0, NEW) == (1, 1)  # not listed: not waited for
    assert leader_for({**before, 3: None}, 0, NEW) == "broker 3 did not answer"


@given(st.binary(min_size=16, max_size=16))
def test_topic_ids_read_back_as_librdkafka_prints_them(raw: bytes) -> None:
    text = wire.uuid_text(raw)
    assert len(text) == 22 and "=" not in text
    assert wire.uuid_bytes(text) == raw
    assert wire.uuid_bytes(text.replace("+", "-").replace("/", "_")) == raw  # Kafka's own tools' form


class _Broker:
    """One canned response on a socket pair; the request it was sent is kept."""

    def __init__(self, response_body: bytes) -> None:
        self.client, self.server = socket.socketpair()
        self.body, self.request = response_body, b""
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        size = struct.unpack(">i", wire.read_exactly(self.server, 4))[0]
        self.request = wire.read_exactly(self.server, size)
        correlation = self.request[4:8]
        message = correlation + b"\0" + self.body  # response header v1: no tagged fields
        self.server.sendall(struct.pack(">i", len(message)) + message)
        self.server.close()

    def conn(self) -> direct.Connection:
        return direct.Connection(self.client)


def _header(r: wire.Reader) -> tuple[int, int]:
    api, version = r.int16(), r.int16()
    r.int32()
    assert r.string() == wire.CLIENT_ID
    r.skip_tags()
    return api, version


def test_fetch_v13_names_the_topic_by_id_and_reads_the_partition_header() -> None:
    topic_id = wire.uuid_text(bytes(range(16)))
    partition = (
        struct.pack(">ihqqq", 0, UNKNOWN_TOPIC_ID, -1, -1, -1) + b"\x01" + struct.pack(">i", -1) + b"\x01\0"
    )
    body = struct.pack(">ihi", 0, 0, 0) + wire.compact_array(
        [bytes(range(16)) + wire.compact_array([partition]) + b"\0"]
    )
    broker = _Broker(body + b"\0")
    with broker.conn() as conn:
        answers = direct.fetch(conn, topic_id, {0: (20, 0)})
    broker.thread.join(5)
    assert answers == {0: direct.FetchAnswer(UNKNOWN_TOPIC_ID, -1, -1, -1)}
    r = wire.Reader(broker.request)
    assert _header(r) == (1, 13)
    # ReplicaId, MaxWaitMs, MinBytes, MaxBytes, IsolationLevel, SessionId, SessionEpoch
    assert [r.int32(), r.int32(), r.int32(), r.int32(), r.int8(), r.int32(), r.int32()] == [
        -1,
        0,
        0,
        1,
        1,
        0,
        -1,
    ]
    assert r.array() == 1 and r.uuid() == topic_id and r.array() == 1
    # Partition, CurrentLeaderEpoch, FetchOffset, LastFetchedEpoch, LogStartOffset, PartitionMaxBytes
    assert [r.int32(), r.int32(), r.int64(), r.int32(), r.int64(), r.int32()] == [0, 0, 20, -1, -1, 1]
    r.skip_tags()
    r.skip_tags()
    assert r.array() == 0 and r.compact_string() == ""  # no forgotten topics, no rack
    r.skip_tags()
    assert r.at == len(r.data)


def test_list_offsets_v7_carries_the_current_leader_epoch_and_no_topic_id() -> None:
    partition = struct.pack(">ihqqi", 0, 0, -1, 20, 0) + b"\0"
    body = struct.pack(">i", 0) + wire.compact_array(
        [wire.compact_string("t") + wire.compact_array([partition]) + b"\0"]
    )
    broker = _Broker(body + b"\0")
    with broker.conn() as conn:
        got = direct.list_offsets(conn, "t", {0: 0}, direct.EARLIEST)
    broker.thread.join(5)
    assert got == {0: direct.Offset(0, 20, 0)}
    r = wire.Reader(broker.request)
    assert _header(r) == (2, 7)
    assert (r.int32(), r.int8(), r.array(), r.compact_string(), r.array()) == (-1, 1, 1, "t", 1)
    assert (r.int32(), r.int32(), r.int64()) == (0, 0, direct.EARLIEST)
