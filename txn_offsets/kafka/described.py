"""The topics this process last described, per Kafka client: each topic's id and partitions, and
when Kafka said so.

A running job's plan over more than a request's worth of partitions may reuse a description made
within a few seconds instead of describing its topics again (DescribeTopics builds four Python
objects per partition: ~80 ms of CPU at 4,096 partitions, a third of such a plan). Safe because
nothing a reused description plans is committed on its word: the check after every read
(:func:`txn_offsets.commit.proof.check_incarnation`) always asks Kafka, and refuses records of
a topic re-created since its plan; a plan that would move an offset describes afresh first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from txn_offsets.ranges import TopicPartition

__all__ = ["TopicInfo", "forget_descriptions", "partitions_seen", "recent", "remember"]


@dataclass(frozen=True)
class TopicInfo:
    """One topic as Kafka describes it: its id (a new one each time the topic is created under
    this name) and its partition ids. `described` is False for a description reused from an
    earlier answer (:func:`recent`): what it says may have changed since."""

    name: str
    topic_id: str
    partitions: tuple[int, ...]
    described: bool = field(default=True, compare=False)


_last: dict[tuple[str, str], tuple[float, TopicInfo]] = {}  # (client key, topic) -> (when, what)
_lock = threading.Lock()


def remember(key: str, infos: Iterable[TopicInfo]) -> None:
    """Kafka has just described these topics to the client `key`."""
    now = time.monotonic()
    with _lock:
        _last.update({(key, info.name): (now, info) for info in infos})


def partitions_seen(key: str, topics: Sequence[str]) -> list[TopicPartition]:
    """The partitions of `topics` as last described (none for a topic never described)."""
    with _lock:
        found = [seen[1] for topic in topics if (seen := _last.get((key, topic))) is not None]
    return [(info.name, p) for info in found for p in info.partitions]


def recent(key: str, topics: Sequence[str], within_s: float) -> dict[str, TopicInfo] | None:
    """Every topic of `topics` as described to `key` within the last `within_s` seconds (marked
    ``described=False``), or None if one was not."""
    oldest = time.monotonic() - within_s
    with _lock:
        found = {topic: _last.get((key, topic)) for topic in topics}
    if not topics or any(seen is None or seen[0] < oldest for seen in found.values()):
        return None
    return {topic: replace(seen[1], described=False) for topic, seen in found.items() if seen is not None}


def forget_descriptions(topics: Iterable[str] | None = None) -> None:
    """The next plans describe `topics` (all topics: None) again, on every client: after a topic
    was found re-created, say."""
    with _lock:
        if topics is None:
            _last.clear()
            return
        names = set(topics)
        for key in [k for k in _last if k[1] in names]:
            del _last[key]
