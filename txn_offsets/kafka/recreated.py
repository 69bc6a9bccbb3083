"""A re-created topic's marks as the log that holds its new topic id answers them.

ListOffsets names a topic only by its name (no version up to Kafka 4.1's v10 carries the id), and
a leader answers it from whatever log it holds under that name. A broker that lags behind the
metadata log - cut off from the controllers, not fenced yet (``broker.session.timeout.ms``) - still
holds a deleted topic's log; re-created with that broker as its leader (epoch 0 both times: the
epoch check passes, librdkafka sends it), the topic's (log start, end) come back from the OLD log
beside the NEW id (reproduced on the lab: tests/lab/test_lab_recreated_topic.py). A skip to that log
start passes over the new topic's first records. The same broker also describes the topic with its
OLD id to whoever asks it: to the planner, that is the topic "re-created" back to the old id.

So :func:`watermarks` asks ListOffsets as usual, then every broker, each on a connection of its
own (:mod:`txn_offsets.kafka.direct`), for its own metadata: the brokers it lists, the topic's id,
each partition's leader and epoch. The brokers every answering broker lists (a fenced broker is
listed by none of the others, whatever it says of itself) must all answer, name the planned id and
the same leader (:func:`leader_for`); that leader then gets a Fetch v13 that names the topic by the
id, at the offset ListOffsets gave: a broker whose log under the name is another id's answers
UNKNOWN_TOPIC_ID or INCONSISTENT_TOPIC_ID; an answer without error carries the marks of the log with
that id (log start; last stable offset or high watermark), which are the ones taken
(:func:`confirm`). Anything short of that is asked again until the plan's timeout. One connection
per broker and one Fetch per (topic, leader), only for partitions whose stored offset would move.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka import direct, metadata
from txn_offsets.kafka.admins import connected_admin, describe_error, forget_admin_client
from txn_offsets.ranges import TopicPartition as TP

__all__ = ["View", "confirm", "leader_for", "watermarks"]

logger = logging.getLogger(__name__)
RETRY_S = 0.5  # between attempts while a leader still holds another log under the name
CONNECT_S = 5.0  # per broker connection and request: one that answers nothing is not waited for longer
_warned: set[str] = set()


def confirm(answer: direct.FetchAnswer, *, read_committed: bool) -> tuple[int, int] | str:
    """The (log start, end) a Fetch by topic id answered - the end at the readers' isolation level
    - or why they cannot be taken (the broker holds no log with that id, or answered nothing usable)."""
    if answer.error != 0:
        return _name(answer.error)
    end = answer.last_stable_offset if read_committed else answer.high_watermark
    if not 0 <= answer.log_start_offset <= end:
        return f"marks ({answer.log_start_offset}, {end}) out of order"
    return answer.log_start_offset, end


@dataclass(frozen=True)
class View:
    """One broker's own metadata of one topic: its id (None: no such topic), each partition's
    (leader, leader epoch), and the brokers it lists."""

    topic_id: str | None
    leaders: Mapping[int, tuple[int, int]]
    listed: frozenset[int]


def leader_for(views: Mapping[int, View | None], partition: int, topic_id: str) -> tuple[int, int] | str:
    """(leader, leader epoch) to confirm `partition`'s marks with, from the brokers' own views of
    the topic (None: the broker did not answer), or why there is none yet. The voters are the
    brokers that answered and that every answering broker lists; each broker a voter lists must have
    answered, and every voter must name `topic_id` and the same leader and epoch, a voter itself."""
    answered = {b: v for b, v in views.items() if v is not None}
    voters = {b: v for b, v in answered.items() if all(b in w.listed for w in answered.values())}
    if not voters:
        return "no broker is listed by every other"
    silent = sorted({b for v in voters.values() for b in v.listed} - set(answered))
    if silent:
        return f"broker {silent[0]} did not answer"
    for broker, view in sorted(voters.items()):
        if view.topic_id != topic_id:
            has = "no such topic" if view.topic_id is None else f"topic id {view.topic_id}"
            return f"broker {broker} has {has}"
    named = {v.leaders.get(partition) for v in voters.values()}
    if len(named) != 1:
        return "the brokers name different leaders"
    (leader,) = named
    if leader is None or leader[0] not in voters:
        return "no leader"
    return leader


def _name(code: int) -> str:
    try:
        return KafkaError(code).name()
    except Exception:  # a code this librdkafka does not know
        return f"error {code}"


def watermarks(
    kafka: KafkaSettings, partitions: Sequence[TP], topic_ids: Mapping[str, str], *, timeout_s: float
) -> dict[TP, tuple[int, int]]:
    """(log start, end) of `partitions` of re-created topics (`topic_ids`: each topic's id now), each
    confirmed by the partition's leader for that id (see the module); asked again until `timeout_s`
    (a lagging leader is fenced, or catches up, within seconds), then ServiceUnavailable naming the
    partition and the broker's answer (the topic re-created once more meanwhile ends so too: the
    next plan describes it again). Never described here: a lagging broker describes the old id."""
    deadline = time.monotonic() + timeout_s
    read_committed = kafka.isolation_level == "read_committed"
    while True:
        left = max(0.1, deadline - time.monotonic())
        asked = metadata.watermarks(kafka, partitions, timeout_s=left)
        try:
            answers, refusals = _fetched(kafka, asked, topic_ids, left)
        except direct.Unsupported as exc:
            if exc.args[0] not in _warned:
                _warned.add(exc.args[0])
                logger.warning(
                    "a re-created topic's marks are taken from ListOffsets unconfirmed: the topic-id check "
                    "cannot use %s (docs/reliability.md, re-created topics)",
                    exc.args[0],
                )
            return asked
        out: dict[TP, tuple[int, int]] = {}
        refused: dict[TP, str] = {}
        for tp in partitions:
            got = confirm(answers[tp], read_committed=read_committed) if tp in answers else refusals[tp]
            if isinstance(got, str):
                refused[tp] = got
            else:
                out[tp] = got
        if not refused:
            return out
        tp, why = next(iter(refused.items()))
        if time.monotonic() + RETRY_S > deadline:
            raise ServiceUnavailable(
                "Kafka",
                kafka.bootstrap_servers,
                f"{tp[0]}[{tp[1]}] was re-created, and the brokers do not confirm its topic id "
                f"{topic_ids[tp[0]]} ({why}) after {timeout_s:.0f}s; the next plan asks again",
            )
        logger.info(
            "%s[%d] re-created: its new id is not confirmed yet (%s); asking again", tp[0], tp[1], why
        )
        forget_admin_client(kafka, roles=("offsets",))  # the next ListOffsets looks the leaders up again
        time.sleep(RETRY_S)


def _fetched(
    kafka: KafkaSettings, asked: Mapping[TP, tuple[int, int]], topic_ids: Mapping[str, str], timeout_s: float
) -> tuple[dict[TP, direct.FetchAnswer], dict[TP, str]]:
    """Each partition's Fetch answer by topic id at the log start ListOffsets gave, from the leader
    the brokers agree on (:func:`leader_for`), or why it was not asked. The brokers: those a
    librdkafka metadata request lists, and any one of them lists."""
    config = kafka.client_config()
    isolation = (
        direct.READ_COMMITTED if kafka.isolation_level == "read_committed" else direct.READ_UNCOMMITTED
    )
    topics = sorted({t for t, _ in asked})
    try:
        seed = connected_admin(kafka, timeout_s).list_topics(topic=topics[0], timeout=timeout_s)
    except Exception as exc:
        raise ServiceUnavailable(
            "Kafka", kafka.bootstrap_servers, f"metadata: {describe_error(exc)}"
        ) from None
    addresses = {b.id: (str(b.host), int(b.port)) for b in seed.brokers.values()}
    fetched: dict[TP, direct.FetchAnswer] = {}
    refused: dict[TP, str] = {}
    with contextlib.ExitStack() as stack:
        conns: dict[int, direct.Connection] = {}
        answers: dict[int, direct.Cluster | None] = {}
        while todo := sorted(set(addresses) - set(answers)):
            for broker in todo:
                try:
                    conn = direct.connect(config, *addresses[broker], min(timeout_s, CONNECT_S))
                    conns[broker] = stack.enter_context(conn)
                    cluster = direct.metadata(conns[broker], topics)
                except (OSError, ValueError) as exc:
                    logger.info("broker %d (%s:%d) did not answer: %s", broker, *addresses[broker], exc)
                    answers[broker] = None
                    continue
                answers[broker] = cluster
                for other, address in cluster.brokers.items():
                    addresses.setdefault(other, address)
        # one Fetch per (topic, leader) for all of its partitions: (fetch offset, leader epoch) each
        wanted: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        for (topic, part), (start, _) in asked.items():
            views = {b: _view(a, topic) for b, a in answers.items()}
            leader = leader_for(views, part, topic_ids[topic])
            if isinstance(leader, str):
                refused[(topic, part)] = leader
                continue
            wanted.setdefault((topic, leader[0]), {})[part] = (start, leader[1])
        for (topic, broker), parts in wanted.items():
            try:
                answer = direct.fetch(conns[broker], topic_ids[topic], parts, isolation=isolation)
            except (OSError, ValueError) as exc:
                refused |= {
                    (topic, part): f"broker {broker} did not answer the Fetch: {exc}" for part in parts
                }
                continue
            fetched |= {(topic, part): answer[part] for part in parts}
    return fetched, refused


def _view(answer: direct.Cluster | None, topic: str) -> View | None:
    if answer is None:
        return None
    own = answer.topics.get(topic)
    known = own is not None and own.error == 0
    return View(
        own.topic_id if own is not None and known else None,
        {p: (x.leader, x.leader_epoch) for p, x in own.partitions.items()}
        if own is not None and known
        else {},
        frozenset(answer.brokers),
    )
