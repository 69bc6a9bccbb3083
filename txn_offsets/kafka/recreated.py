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

The same broker serves a reader whose librdkafka took the OLD id from its metadata: a Fetch by
that id returns the old log's records at the planned offsets (lab: librdkafka 2.16 sent Fetch v16
by the new id, got UNKNOWN_TOPIC_ID, asked metadata again, got X's old id and read the old
records), while any other broker still describes the new id. So the commit's proof asks every
broker it can reach, on connections kept per process (:class:`Brokers`), its own view of the
topics: no answering broker may name another id (:func:`contradiction`).

That proof comes AFTER the read: a lagging broker that catches up in between (it applies the
deletion and the new topic, as every other broker did) then names the new id too, and the old
log's records it served would pass. So a plan's ranges are not handed out before every broker
named each of their topic ids at least once (:func:`settle`): a broker that names the new id has
applied the deletion before it (brokers apply the metadata log in order) and never serves the old
log again, so no read after that moment can get the old records, whatever the broker does later.
Once every broker this process reaches has said so for a (topic, id), it is not asked again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaError

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable, TopicChanged
from txn_offsets.kafka import direct, metadata
from txn_offsets.kafka.admins import connected_admin, describe_error, forget_admin_client
from txn_offsets.ranges import TopicPartition as TP

__all__ = [
    "Brokers",
    "View",
    "brokers",
    "confirm",
    "contradiction",
    "leader_for",
    "settle",
    "unsupported",
    "watermarks",
]

logger = logging.getLogger(__name__)
RETRY_S = 0.5  # between attempts while a leader still holds another log under the name
CONNECT_S = 5.0  # per broker connection and request: one that answers nothing is not waited for longer
DOWN_S = 10.0  # a broker that did not answer the proof is not asked again for this long
#: a topic of more partitions is asked for its id alone (:func:`direct.send_topic_ids`) by Brokers
WIDE_PARTITIONS = 128
_warned: set[str] = set()


def confirm(answer: direct.FetchAnswer, *, read_committed: bool) -> tuple[int, int] | str:
    """The (log start, end) a Fetch by topic id answered - the end at the readers' isolation level
    - or why they cannot be taken (the broker holds no log with that id, or answered nothing usable)."""
    if answer.error != 0:
        return _name(answer.error)
    end = answer.end(read_committed=read_committed)
    if not 0 <= answer.log_start_offset <= end:
        return f"marks ({answer.log_start_offset}, {end}) out of order"
    return answer.log_start_offset, end


@dataclass(frozen=True)
class View:
    """One broker's own metadata of one topic: its id (None: no such topic), each partition's
    (leader, leader epoch) - none in a :class:`Brokers` view of a topic of more than
    WIDE_PARTITIONS partitions, whose id alone is asked - and the brokers it lists."""

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


def contradiction(views: Mapping[str, View | None], topic_id: str) -> tuple[str, str | None] | None:
    """None when the brokers' own views of a topic (by broker; None: no answer) prove `topic_id`:
    at least one names it and no other id is named by any (a broker that does not know the topic
    serves none of it). Else (the broker, the id it names; None: no broker has the topic)."""
    answered = {b: v for b, v in views.items() if v is not None}
    for broker, view in sorted(answered.items()):
        if view.topic_id is not None and view.topic_id != topic_id:
            return broker, view.topic_id
    if any(v.topic_id == topic_id for v in answered.values()):
        return None
    return min(answered, default=""), None


class Brokers:
    """Connections to every broker of one cluster, kept by this process: each broker's own view of
    some topics (:meth:`views`). The brokers: the bootstrap servers and every broker one of them
    lists; one that does not answer is left out for DOWN_S (a dead broker costs the proof nothing)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.config = kafka.client_config()
        direct.check_settings(self.config)  # Unsupported now, not at the first proof
        self.known: dict[str, tuple[str, int]] = {}
        self.seen: set[tuple[str, int]] = set()
        for server in kafka.bootstrap_servers.split(","):
            host, _, port = server.strip().rpartition("/")[2].rpartition(":")
            if host and port.isdigit():
                self._learn(host.strip("[]"), int(port))
            elif server.strip():  # librdkafka's default port
                self._learn(server.strip().rpartition("/")[2].strip("[]"), 9092)
        self.conns: dict[str, direct.Connection] = {}
        self.down_until: dict[str, float] = {}
        self.lock = threading.Lock()
        self.settled: set[tuple[str, str]] = set()  # (topic, id) every broker named (:func:`settle`)
        self.wide: set[str] = set()  # topics a broker listed over WIDE_PARTITIONS partitions for

    def _learn(self, host: str, port: int) -> None:
        if (host, port) in self.seen:  # resolved once
            return
        self.seen.add((host, port))
        try:
            address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
        except OSError:
            address = host
        self.known.setdefault(f"{address}:{port}", (host, port))

    def views(self, topics: Sequence[str], timeout_s: float) -> dict[str, dict[str, View | None]]:
        """Each broker's own view of each of `topics`, by broker address; None for a broker that
        did not answer (now, or within DOWN_S). A topic once listed with more than WIDE_PARTITIONS
        partitions is asked for its id alone (:func:`direct.send_topic_ids`): every commit's proof
        asks, and the proof needs the id only."""
        with self.lock:
            out: dict[str, dict[str, View | None]] = {}
            while todo := sorted(set(self.known) - set(out)):
                answers = self._ask(todo, topics, timeout_s)
                for broker in todo:
                    cluster = answers.get(broker)
                    out[broker] = {t: _view(cluster, t) for t in topics}
                    if cluster is not None:
                        self.wide.update(
                            t for t, own in cluster.topics.items() if len(own.partitions) > WIDE_PARTITIONS
                        )
                    for host, port in cluster.brokers.values() if cluster else ():
                        self._learn(host, port)
            return out

    def _ask(
        self, brokers: Sequence[str], topics: Sequence[str], timeout_s: float
    ) -> dict[str, direct.Cluster]:
        """The metadata `brokers` answer, asked at once: every request sent (on the kept
        connection, else a new one) before any answer is read. A kept connection that fails (the
        broker closed it meanwhile) is replaced once; a broker not reached is down for DOWN_S."""
        sent: dict[str, tuple[direct.Connection, direct.IdsAsked]] = {}
        again: list[str] = []
        for broker in brokers:
            if self.down_until.get(broker, 0.0) > time.monotonic():
                continue
            conn = self.conns.pop(broker, None)
            if conn is None:
                again.append(broker)
                continue
            try:
                sent[broker] = (conn, direct.send_topic_ids(conn, topics, wide=self.wide))
            except (OSError, ValueError):
                conn.close()
                again.append(broker)
        out: dict[str, direct.Cluster] = {}
        for broker, (conn, asked) in sent.items():
            try:
                out[broker] = direct.topic_ids_answer(conn, asked)
                self.conns[broker] = conn
            except (OSError, ValueError):
                conn.close()
                again.append(broker)
        for broker in again:  # new connections: the first proof, or a kept one gone
            try:
                conn = direct.connect(self.config, *self.known[broker], min(timeout_s, CONNECT_S))
            except (OSError, ValueError) as exc:
                self._down(broker, exc)
                continue
            try:
                out[broker] = direct.topic_ids_answer(
                    conn, direct.send_topic_ids(conn, topics, wide=self.wide)
                )
                self.conns[broker] = conn
            except (OSError, ValueError) as exc:
                conn.close()
                self._down(broker, exc)
        return out

    def _down(self, broker: str, exc: Exception) -> None:
        logger.info("broker %s did not answer the topic-id proof: %s", broker, exc)
        self.down_until[broker] = time.monotonic() + DOWN_S


_BROKERS: dict[tuple[int, KafkaSettings], Brokers] = {}  # per (forked) process and cluster


def brokers(kafka: KafkaSettings) -> Brokers:
    """This process's :class:`Brokers` of `kafka` (Unsupported: settings the direct client lacks)."""
    key = (os.getpid(), kafka)
    found = _BROKERS.get(key)
    if found is None:
        found = _BROKERS.setdefault(key, Brokers(kafka))
    return found


def settle(
    kafka: KafkaSettings,
    topic_ids: Mapping[str, str],
    *,
    timeout_s: float,
    gone: Literal["raise", "proof"] = "raise",
) -> None:
    """Return once no broker this process reaches names another id for a topic of `topic_ids` (the
    ids a plan's ranges carry, before any of them is read: see the module); asked again until
    `timeout_s`, then ServiceUnavailable naming the broker and the id it still names; TopicChanged
    at once when no broker names the plan's id but one names another (re-created since; with
    ``gone="proof"`` left to the commit's proof, as a reader does: its task's commit then refuses
    the records on the path every re-created topic takes). A (topic, id)
    every known broker named is remembered for the process; with a broker silent, the next plan
    asks again. Settings the direct client cannot speak: one warning, nothing asked."""
    try:
        reach = brokers(kafka)
    except direct.Unsupported as exc:
        unsupported(exc, "plans are not held back for a broker behind the cluster's metadata")
        return
    todo = {t: i for t, i in topic_ids.items() if (t, i) not in reach.settled}
    deadline = time.monotonic() + timeout_s
    while todo:
        views = reach.views(sorted(todo), min(CONNECT_S, max(0.1, deadline - time.monotonic())))
        behind: dict[str, tuple[str, str]] = {}
        for topic, topic_id in sorted(todo.items()):
            named = {b: v.topic_id for b, by_topic in views.items() if (v := by_topic[topic]) is not None}
            other = sorted((b, i) for b, i in named.items() if i is not None and i != topic_id)
            if other and topic_id not in named.values():  # the plan's id is gone (re-created since)
                if gone == "raise":
                    raise TopicChanged(topic, topic_id, other[0][1])
                del todo[topic]  # gone="proof": the commit's proof refuses what is read
                continue
            if other:
                behind[topic] = other[0]
                continue
            del todo[topic]
            if len(named) == len(views) and topic_id in named.values():
                reach.settled.add((topic, topic_id))
        if not behind:
            return
        topic, (broker, found) = next(iter(behind.items()))
        if time.monotonic() + RETRY_S > deadline:
            raise ServiceUnavailable(
                "Kafka",
                kafka.bootstrap_servers,
                f"broker {broker} still names topic id {found} for {topic!r}, planned as "
                f"{topic_ids[topic]} (a broker behind the cluster's metadata - cut off from the "
                f"controllers? - may serve the deleted topic's records) after {timeout_s:.0f}s; "
                f"the next plan asks again",
            )
        logger.info("%s: broker %s still names topic id %s; asking again", topic, broker, found)
        time.sleep(RETRY_S)


def unsupported(exc: direct.Unsupported, instead: str) -> None:
    """Warn once per setting that the direct client cannot use it, and what is done `instead`."""
    if exc.args[0] not in _warned:
        _warned.add(exc.args[0])
        logger.warning(
            "%s: the topic-id check cannot use %s (docs/reliability.md, re-created topics)",
            instead,
            exc.args[0],
        )


def _name(code: int) -> str:
    try:
        return KafkaError(code).name()
    except Exception:  # a code this librdkafka does not know
        return f"error {code}"


def watermarks(
    kafka: KafkaSettings, partitions: Sequence[TP], topic_ids: Mapping[str, str], *, timeout_s: float
) -> dict[TP, tuple[int, int]]:
    """(log start, end) of `partitions` an offset moves or is seeded on (`topic_ids`: their ids now), each
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
            unsupported(exc, "a re-created topic's marks are taken from ListOffsets unconfirmed")
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
                f"{tp[0]}[{tp[1]}]: the brokers do not confirm its topic id "
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
    isolation = direct.isolation(kafka.isolation_level)
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
        # each broker's view of a topic, made once per topic (once per partition was quadratic:
        # 4,096 partitions x a view of 4,096 partitions, ~1 s of a plan's driver time)
        views = {t: {b: _view(a, t) for b, a in answers.items()} for t in topics}
        for (topic, part), (start, _) in asked.items():
            leader = leader_for(views[topic], part, topic_ids[topic])
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
