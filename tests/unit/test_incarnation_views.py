"""The commit's topic-incarnation proof asks every broker it reaches for its own view of the topic
(:func:`txn_offsets.kafka.recreated.contradiction`): one broker naming another id - a broker cut
off from the controllers still holds the deleted topic's log and serves it to a reader that took
its old id (tests/lab/test_lab_recreated_topic.py) - refuses the commit, whatever the others say;
a broker that does not know the topic or does not answer serves none of it. Settings the direct
client lacks, or no broker answering, fall back to one librdkafka description."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.commit import proof
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable, TopicChanged
from txn_offsets.kafka import recreated
from txn_offsets.kafka.described import TopicInfo
from txn_offsets.kafka.recreated import Brokers, View, contradiction
from txn_offsets.ranges import OffsetRange

NEW, OLD = "new-id", "old-id"


def _view(topic_id: str | None) -> View:
    return View(topic_id, {0: (2, 0)} if topic_id else {}, frozenset({1, 2, 3}))


VIEWS = st.dictionaries(
    st.sampled_from(["b1:9092", "b2:9092", "b3:9092", "10.0.0.4:9092"]),
    st.one_of(st.none(), st.sampled_from([NEW, OLD, None]).map(_view)),
)


@given(views=VIEWS)
def test_proven_exactly_when_a_broker_names_the_id_and_none_names_another(
    views: dict[str, View | None],
) -> None:
    ids = [v.topic_id for v in views.values() if v is not None]
    got = contradiction(views, NEW)
    if NEW in ids and OLD not in ids:
        assert got is None
    elif OLD in ids:
        assert got is not None and got[1] == OLD and views[got[0]] == _view(OLD)
    else:
        assert got is not None and got[1] is None


def test_the_lagging_leader_alone_on_the_old_id_refuses_what_the_others_prove() -> None:
    # the lab: X (broker 2) cut off, still on the old id; Y and Z describe the new one
    views = {"kafka-1:9092": _view(NEW), "kafka-2:9092": _view(OLD), "kafka-3:9092": _view(NEW)}
    assert contradiction(views, NEW) == ("kafka-2:9092", OLD)
    assert contradiction({**views, "kafka-2:9092": None}, NEW) is None  # X unreachable: serves no one here


class _Brokers:
    def __init__(self, views: dict[str, dict[str, View | None]]) -> None:
        self.answer, self.asked = views, 0

    def views(self, topics: Any, timeout_s: float) -> dict[str, dict[str, View | None]]:
        self.asked += 1
        return self.answer


KAFKA = KafkaSettings("b1:9092,b2:9092")
RANGE = OffsetRange("t", 0, 0, 30, NEW)


def _described(monkeypatch: pytest.MonkeyPatch, topic_id: str) -> list[int]:
    calls: list[int] = []

    def describe(kafka: KafkaSettings, topics: Any, *, timeout_s: float) -> dict[str, TopicInfo]:
        calls.append(1)
        return {"t": TopicInfo("t", topic_id, (0,))}

    monkeypatch.setattr(proof, "describe_topics", describe)
    return calls


def test_the_proof_refuses_a_unit_one_broker_describes_with_another_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _Brokers({"b1:9092": {"t": _view(NEW)}, "b2:9092": {"t": _view(OLD)}})
    monkeypatch.setattr(recreated, "brokers", lambda kafka: fake)
    described = _described(monkeypatch, NEW)  # what librdkafka's one broker said before
    with pytest.raises(TopicChanged, match=OLD):
        proof.check_incarnation(KAFKA, [RANGE])
    assert (fake.asked, described) == (1, [])


def test_the_proof_passes_when_every_answering_broker_names_the_id(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Brokers({"b1:9092": {"t": _view(NEW)}, "b2:9092": {"t": None}, "b3:9092": {"t": _view(None)}})
    monkeypatch.setattr(recreated, "brokers", lambda kafka: fake)
    described = _described(monkeypatch, OLD)
    proof.check_incarnation(KAFKA, [RANGE])
    assert (fake.asked, described) == (1, [])


def test_no_broker_answering_falls_back_to_one_description(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Brokers({"b1:9092": {"t": None}, "b2:9092": {"t": None}})
    monkeypatch.setattr(recreated, "brokers", lambda kafka: fake)
    described = _described(monkeypatch, OLD)
    with pytest.raises(TopicChanged, match=OLD):
        proof.check_incarnation(KAFKA, [RANGE])
    assert described == [1]


def test_settings_the_direct_client_lacks_fall_back_to_one_description(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = KafkaSettings("b1:9092", extra={"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"})
    described = _described(monkeypatch, NEW)
    proof.check_incarnation(kafka, [RANGE])
    assert described == [1]


def test_a_broker_that_refuses_the_connection_is_left_out_and_not_asked_again_at_once() -> None:
    with socket.socket() as free:  # a port nothing listens on: refused at once
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    brokers = Brokers(KafkaSettings(f"127.0.0.1:{port},localhost:{port}"))
    assert list(brokers.known) == [f"127.0.0.1:{port}"]  # one broker, however it is named
    assert brokers.views(["t"], 1.0) == {f"127.0.0.1:{port}": {"t": None}}
    assert brokers.down_until[f"127.0.0.1:{port}"] > 0
    before = dict(brokers.down_until)
    assert brokers.views(["t"], 1.0) == {f"127.0.0.1:{port}": {"t": None}}
    assert brokers.down_until == before  # not asked: no new connection attempt


def test_the_bootstrap_servers_are_read_as_librdkafka_reads_them() -> None:
    brokers = Brokers(KafkaSettings("127.0.0.1:19092, PLAINTEXT://127.0.0.2:19093,127.0.0.3"))
    assert brokers.known == {
        "127.0.0.1:19092": ("127.0.0.1", 19092),
        "127.0.0.2:19093": ("127.0.0.2", 19093),
        "127.0.0.3:9092": ("127.0.0.3", 9092),
    }


# A plan's ranges are handed out only once no broker names another id for their topics
# (recreated.settle): the proof comes after the read, and a lagging broker that catches up in
# between would name the new id too, passing the old log's records it served.
class _Settling(_Brokers):
    def __init__(self, answers: list[dict[str, dict[str, View | None]]]) -> None:
        super().__init__(answers[0])
        self.answers, self.settled = answers, set[tuple[str, str]]()

    def views(self, topics: Any, timeout_s: float) -> dict[str, dict[str, View | None]]:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]


@given(views=VIEWS)
def test_a_plan_is_held_back_exactly_while_a_broker_names_another_id(views: dict[str, View | None]) -> None:
    fake = _Settling([{b: {"t": v} for b, v in views.items()}])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recreated, "brokers", lambda kafka: fake)
        mp.setattr(recreated, "RETRY_S", 0.0)
        named = [v.topic_id for v in views.values() if v is not None]
        if OLD in named and NEW not in named:  # the plan's id is gone: planned again at once
            with pytest.raises(TopicChanged, match=OLD):
                recreated.settle(KAFKA, {"t": NEW}, timeout_s=10.0)
            recreated.settle(KAFKA, {"t": NEW}, timeout_s=10.0, gone="proof")  # a reader: the proof refuses
            assert (fake.asked, fake.settled) == (2, set())
        elif OLD in named:
            with pytest.raises(ServiceUnavailable, match=f"names topic id {OLD} for 't', planned as {NEW}"):
                recreated.settle(KAFKA, {"t": NEW}, timeout_s=0.0)
            assert fake.settled == set()
        else:
            recreated.settle(KAFKA, {"t": NEW}, timeout_s=0.0)
            remembered = None not in views.values() and NEW in named  # every broker answered, one named it
            assert fake.settled == ({("t", NEW)} if remembered else set())


def test_a_plan_waits_for_the_lagging_broker_then_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    lagging = {"kafka-1:9092": {"t": _view(NEW)}, "kafka-2:9092": {"t": _view(OLD)}}
    caught_up = {"kafka-1:9092": {"t": _view(NEW)}, "kafka-2:9092": {"t": _view(NEW)}}
    fake = _Settling([lagging, lagging, caught_up])
    monkeypatch.setattr(recreated, "brokers", lambda kafka: fake)
    monkeypatch.setattr(recreated, "RETRY_S", 0.01)
    recreated.settle(KAFKA, {"t": NEW}, timeout_s=10)
    assert (fake.asked, fake.settled) == (3, {("t", NEW)})
    recreated.settle(KAFKA, {"t": NEW}, timeout_s=10)  # every broker named it: never asked again
    assert fake.asked == 3
