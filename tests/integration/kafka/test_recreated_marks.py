"""A re-created topic's (log start, end) are taken from the log that holds its new topic id
(:mod:`txn_offsets.kafka.recreated`), whatever ListOffsets answered: on the lab a leader that still
held the deleted topic's log answered ListOffsets from it (tests/lab/test_lab_recreated_topic.py);
here that answer is injected as the first ListOffsets answer, and the broker's Fetch by topic id
(:mod:`txn_offsets.kafka.direct`) decides - over PLAINTEXT and over the stack's SASL_SSL listener
(SCRAM-SHA-512)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.fix_services import TopicFactory
from tests.integration.helpers import produce_counts
from tests.kafka_topics import old_log_first, recreate_topic
from txn_offsets.config import KafkaSettings, kafka_from_env
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka import direct, metadata, recreated


def _recreated(kafka: KafkaSettings, admin: AdminClient, topic: str, old: int, new: int) -> tuple[str, str]:
    produce_counts(kafka.bootstrap_servers, topic, {0: old})
    old_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    recreate_topic(admin, topic, 1)
    produce_counts(kafka.bootstrap_servers, topic, {0: new})
    return old_id, metadata.describe_topics(kafka, [topic])[topic].topic_id


@pytest.mark.parametrize(
    ("old_marks", "asked"),
    [((50, 100), 2), ((5, 100), 1)],
    ids=["old-start-past-the-new-end", "old-start-inside-the-new-log"],
)
def test_the_marks_of_a_re_created_topic_are_its_new_logs_whatever_listoffsets_said(
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
    old_marks: tuple[int, int],
    asked: int,
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    _, new_id = _recreated(kafka, kafka_admin, topic, 100, 10)
    calls = old_log_first(monkeypatch, old_marks)
    # past the new log's end the Fetch answers OFFSET_OUT_OF_RANGE: asked again; inside it, the
    # Fetch's own partition header (log start 0, end 10) is taken, never ListOffsets' (5, 100)
    assert recreated.watermarks(kafka, [(topic, 0)], {topic: new_id}, timeout_s=10) == {(topic, 0): (0, 10)}
    assert len(calls) >= asked  # a busy broker may take one more round


def test_the_broker_answers_a_fetch_by_the_old_id_unknown_and_by_the_new_one_with_its_marks(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    old_id, new_id = _recreated(kafka, kafka_admin, topic, 30, 7)
    host, port = kafka_bootstrap.rsplit(":", 1)
    with direct.connect({}, host, int(port), 10) as conn:
        own = direct.metadata(conn, [topic]).topics[topic]
        assert (own.topic_id, own.partitions[0].leader_epoch) == (new_id, 0)
        assert direct.fetch(conn, old_id, {0: (0, -1)})[0].error == 100  # UNKNOWN_TOPIC_ID
        assert direct.fetch(conn, new_id, {0: (0, 0)})[0] == direct.FetchAnswer(0, 7, 7, 0)
        ends = direct.list_offsets(conn, topic, {0: 0}, direct.LATEST)
        assert ends == {0: direct.Offset(0, 7, 0)}


def test_a_leader_that_never_holds_the_new_id_is_service_unavailable_naming_it(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=1)
    other_id = "AAAAAAAAAAAAAAAAAAAAAQ"  # an id no topic has: as if the topic went once more
    with pytest.raises(ServiceUnavailable) as info:
        recreated.watermarks(kafka, [(topic, 0)], {topic: other_id}, timeout_s=1.5)
    said = str(info.value)
    assert f"{topic}[0]: the brokers do not confirm its topic id {other_id}" in said
    assert f"has topic id {metadata.describe_topics(kafka, [topic])[topic].topic_id}" in said
    assert "\n" not in said


def test_over_sasl_ssl_the_fetch_by_id_confirms_the_marks(topic_factory: TopicFactory) -> None:
    config = os.environ.get("TXN_OFFSETS_TLS_KAFKA_CONFIG")
    assert config, "TXN_OFFSETS_TLS_KAFKA_CONFIG is not set: start the stack with `make stack-up TLS=1`"
    kafka = kafka_from_env({}, config_file=Path(config))
    topic = topic_factory(partitions=1)
    produce_counts(os.environ["TXN_OFFSETS_KAFKA_BOOTSTRAP"], topic, {0: 12})
    topic_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    assert recreated.watermarks(kafka, [(topic, 0)], {topic: topic_id}, timeout_s=10) == {(topic, 0): (0, 12)}


def test_settings_it_cannot_speak_are_refused_before_connecting() -> None:
    for config, named in [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism OAUTHBEARER"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "sasl.mechanism GSSAPI"),
        (
            {"security.protocol": "SSL", "ssl.keystore.location": "/k.p12"},
            "SSL setting ssl.keystore.location",
        ),
    ]:
        with pytest.raises(direct.Unsupported, match=named):
            direct.connect(config, "192.0.2.1", 9, 0.1)  # TEST-NET-1: never contacted


def test_the_marks_of_many_partitions_look_at_each_brokers_view_once_per_topic(
    kafka_bootstrap: str, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning 4,096 partitions made each broker's view of the topic (all its partitions) again
    for every partition: quadratic, ~1 s of the driver's plan. Once per topic and broker now, and
    the marks are the topic's."""
    kafka = KafkaSettings(kafka_bootstrap)
    topic = topic_factory(partitions=64)
    produce_counts(kafka_bootstrap, topic, {p: p % 3 for p in range(64)})
    topic_id = metadata.describe_topics(kafka, [topic])[topic].topic_id
    made: list[str] = []
    real_view = recreated._view

    def view(answer: object, name: str) -> object:
        made.append(name)
        return real_view(answer, name)  # type: ignore[arg-type]

    monkeypatch.setattr(recreated, "_view", view)
    rounds: list[int] = []  # a busy broker may take one more round (each asks its Fetches again)
    real_fetched = recreated._fetched

    def fetched(*args: Any, **kwargs: Any) -> Any:
        rounds.append(1)
        return real_fetched(*args, **kwargs)

    monkeypatch.setattr(recreated, "_fetched", fetched)
    parts = [(topic, p) for p in range(64)]
    marks = recreated.watermarks(kafka, parts, {topic: topic_id}, timeout_s=10)
    assert marks == {(topic, p): (0, p % 3) for p in range(64)}
    assert rounds and made == [topic] * len(rounds)  # one broker on the stack, one topic, per round
