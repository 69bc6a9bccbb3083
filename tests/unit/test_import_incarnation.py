"""The pure parts of an import's topic-incarnation evidence (issue 41, item 1): a checkpoint's batch
time, the ``--topic-id`` argument, and the rules of ``incarnation_evidence`` that need no Kafka (no
time to check against a log): nothing said is refused, a named id must be Kafka's, a consumer
group is its own evidence. The checks against a real log: tests/integration/store/
test_import_incarnation.py."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from tests.unit.test_checkpoint import write_checkpoint
from txn_offsets.admin.sources import Incarnation, Source, batch_time, from_checkpoint, incarnation_evidence
from txn_offsets.cli.imports import _topic_id
from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka.described import TopicInfo

# never contacted: every case here decides without asking Kafka
KAFKA = KafkaSettings("127.0.0.1:1")
INFOS = {"t": TopicInfo("t", "NEWID", (0, 1))}
MARKS = {("t", 0): (0, 100), ("t", 1): (5, 100)}
OFFSETS = {("t", 0): 60, ("t", 1): 5}


def stamped(root: Path, meta_time: object) -> Path:
    write_checkpoint(root, [{"t": {0: 60}}], 1)
    path = root / "offsets" / "0"
    version, meta, *rest = path.read_text().splitlines()
    fields = json.loads(meta)
    if meta_time is None:
        del fields["batchTimestampMs"]
    else:
        fields["batchTimestampMs"] = meta_time
    path.write_text("\n".join([version, json.dumps(fields), *rest]))
    return root


def test_a_checkpoint_carries_its_batch_time(tmp_path: Path) -> None:
    root = stamped(tmp_path / "c", 1_750_000_000_123)
    assert batch_time(root, 0) == 1_750_000_000_123
    source = from_checkpoint(root)
    assert (source.written_at_ms, source.dropped_with_topic) == (1_750_000_000_123, False)
    assert Incarnation.of(source).written_at_ms == 1_750_000_000_123


@pytest.mark.parametrize("meta_time", [None, 0, -5, True, "1750000000000", 1.5e12])
def test_a_checkpoint_without_a_usable_batch_time_has_none(tmp_path: Path, meta_time: object) -> None:
    assert from_checkpoint(stamped(tmp_path / "c", meta_time)).written_at_ms is None


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("t=AbC", ("t", "AbC")), (" t = AbC ", ("t", "AbC")), ("a.b-c=x=y", ("a.b-c", "x=y"))],
)
def test_topic_id_takes_topic_equals_id(text: str, parsed: tuple[str, str]) -> None:
    assert _topic_id(text) == parsed


@pytest.mark.parametrize("text", ["t", "t=", "=id", " = ", ""])
def test_topic_id_without_both_parts_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="give TOPIC=ID"):
        _topic_id(text)


def check(incarnation: Incarnation) -> tuple[dict[str, str], tuple[str, ...]]:
    return incarnation_evidence(KAFKA, OFFSETS, MARKS, INFOS, incarnation, source="table s.t")


def test_no_evidence_is_refused_naming_both_flags() -> None:
    with pytest.raises(ConfigError) as refused:
        check(Incarnation())
    assert refused.value.setting == "--topic-id"
    text = str(refused.value)
    assert "table s.t does not say which incarnation of t" in text
    assert "pass --topic-id t=ID" in text and "now NEWID" in text and "--current-topic-incarnation" in text


@pytest.mark.parametrize(
    ("named", "message"),
    [
        ({"t": "OLDID"}, "t=OLDID, but Kafka's t has topic id NEWID: the topic was deleted and re-created"),
        ({"t": "NEWID", "u": "X"}, "names u, which this import does not take (it imports t)"),
    ],
)
def test_a_named_topic_id_must_be_kafkas_current_one(named: dict[str, str], message: str) -> None:
    for source_evidence in (
        Incarnation(topic_ids=named),
        Incarnation(dropped_with_topic=True, topic_ids=named),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            check(source_evidence)


def test_the_evidence_used_is_said_per_topic() -> None:
    assert check(Incarnation(topic_ids={"t": "NEWID"})) == ({"t": "topic id NEWID named with --topic-id"}, ())
    said = "topic id NEWID, the current one, on the operator's word (--current-topic-incarnation)"
    assert check(Incarnation(current=True)) == ({"t": said}, ())
    group = "a consumer group's offsets: Kafka deletes them with their topic (topic id NEWID)"
    assert check(Incarnation.of(Source("group", dict(OFFSETS), dropped_with_topic=True))) == (
        {"t": group},
        (),
    )
    # a time with every offset at its log start: nothing passed over, Kafka not asked
    at_start = {("t", 0): 0, ("t", 1): 5}
    evidence, overruled = incarnation_evidence(
        KAFKA, at_start, MARKS, INFOS, Incarnation(written_at_ms=1), source="spark checkpoint"
    )
    assert evidence == {
        "t": "the imported offsets pass over no record of topic id NEWID (each at its log start)"
    }
    assert overruled == ()
