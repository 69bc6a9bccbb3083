"""The examples' data: page-view events as compact JSON, keyed by user.

``{"u": "user-17", "p": "/page/3", "t": <event time ms>, "d": <duration ms>}`` - users and pages
follow a skewed (Zipf-like) distribution, event times advance with jitter, so windows and keys
look like real traffic. :func:`produce` writes them in Kafka transactions (some aborted) and
returns an oracle computed from the committed events only.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from confluent_kafka import Producer

from txn_offsets.kafka.records import Record

WINDOW_MS = 60_000

logger = logging.getLogger(__name__)


class PageView(msgspec.Struct, frozen=True):
    """One page view; decoded from ``{"u": .., "p": .., "t": .., "d": ..}`` by :func:`decode`."""

    user: str = msgspec.field(name="u")
    page: str = msgspec.field(name="p")
    time_ms: int = msgspec.field(name="t")
    duration_ms: int = msgspec.field(name="d")


# a typed decoder: parses straight into PageView and checks every field's type on the way (a string
# time, a float duration or a missing field is an error, never a silent conversion); ~10x faster
# per record than json.loads + building the object in Python
_DECODER = msgspec.json.Decoder(PageView)


def decode(record: Record) -> PageView:
    """Strict decoder: a record that is not a page view raises (and so is rejected, with its offset)."""
    if record.value is None:
        raise ValueError("empty value")
    return _DECODER.decode(record.value)


def window_of(time_ms: int) -> int:
    return time_ms - time_ms % WINDOW_MS


@dataclass
class Oracle:
    """What the produced (committed) data says the results must be."""

    messages: int = 0
    aborted: int = 0
    value_bytes: int = 0
    windows: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    durations: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    per_user: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, view: PageView) -> None:
        key = (window_of(view.time_ms), view.page)
        self.messages += 1
        self.windows[key] += 1
        self.durations[key] += view.duration_ms
        self.per_user[view.user] += 1


def _zipf_sampler(n: int, s: float, rng: random.Random) -> Callable[[int], list[int]]:
    cum = list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))
    population = list(range(n))
    return lambda k: rng.choices(population, cum_weights=cum, k=k)


MAX_STEP_MS = 12  # event times advance 0-12 ms from one record to the next


def transactions(messages: int, per_transaction: int, abort_every: int) -> Iterator[tuple[int, bool]]:
    """(records, aborted?) of each transaction :func:`produce` makes: `messages` committed records
    in transactions of `per_transaction`, every `abort_every`-th transaction (full size) aborted."""
    committed = 0
    txn = 0
    while committed < messages:
        txn += 1
        if abort_every > 0 and txn % abort_every == 0:
            yield per_transaction, True
        else:
            n = min(per_transaction, messages - committed)
            committed += n
            yield n, False


def first_event_time(now_ms: int, messages: int, per_transaction: int, abort_every: int) -> int:
    """Where the event times of :func:`produce` start (a window start): far enough back that the
    last of them is an hour old, however many records (committed and aborted) come before it -
    Kafka rejects a record stamped more than an hour ahead (``log.message.timestamp.after.max.ms``,
    INVALID_TIMESTAMP) and a topic deletes records older than its retention (7 days by default)."""
    # every abort_every-th transaction is aborted: at most one aborted per committed one, plus one
    aborted = 0 if abort_every == 0 else messages + per_transaction
    return window_of(now_ms - 3_600_000 - (messages + aborted) * MAX_STEP_MS)


#: attempts at a transaction whose records' delivery was not confirmed (each aborted) before giving up
TRANSACTION_ATTEMPTS = 3


def _value(view: PageView) -> bytes:
    return json.dumps(
        {"u": view.user, "p": view.page, "t": view.time_ms, "d": view.duration_ms}, separators=(",", ":")
    ).encode()


def _send(
    producer: Producer, topic: str, views: list[PageView], values: list[bytes], partitions: list[int]
) -> list[tuple[Any, int | None]]:
    """Produce `views` (their encoded `values`, each to its partition) in the open transaction;
    every delivery report, once all are in: (error, offset) each."""
    delivered: list[tuple[Any, int | None]] = []
    for view, value, partition in zip(views, values, partitions, strict=True):
        producer.produce(
            topic,
            key=view.user.encode(),
            value=value,
            partition=partition,
            timestamp=view.time_ms,
            on_delivery=lambda err, msg: delivered.append((err, msg.offset())),
        )
        producer.poll(0)
    # every report served before the transaction ends: aborting with records still in flight can
    # fail the producer with INVALID_TXN_STATE on Kafka 4 (the abort races the produce requests)
    producer.flush(60)
    return delivered


def unconfirmed(delivered: Sequence[tuple[Any, int | None]], records: int) -> str | None:
    """Why a transaction's records may not all be in Kafka (None: each has a report, no error and an
    offset). librdkafka's idempotent producer reports a record whose first send was "possibly
    persisted" (a timeout) as delivered WITHOUT an offset when the broker answers its retry with
    DUPLICATE_SEQUENCE_NUMBER - and Kafka may not hold it: seen on a 1,024-partition topic, 1-2
    records of a first transaction missing from the log, read committed and uncommitted alike. Such
    a transaction is aborted and sent again, so the oracle never counts a record Kafka lacks."""
    if len(delivered) != records:
        return f"{len(delivered)} delivery reports for {records} records"
    failed = [err for err, _ in delivered if err is not None]
    if failed:
        return f"{len(failed)} deliveries failed ({failed[0]})"
    blind = sum(1 for _, offset in delivered if offset is None or offset < 0)
    if blind:
        return f"{blind} deliveries reported without an offset (possibly not persisted)"
    return None


def produce(
    bootstrap: str,
    topic: str,
    messages: int,
    *,
    partitions: int = 8,
    per_transaction: int = 5_000,
    abort_every: int = 10,
    seed: int = 7,
    progress: Callable[[int], None] | None = None,
    spread: bool = False,
) -> Oracle:
    """Produce `messages` committed page views (plus aborted transactions) and return the oracle.
    A view goes to its user's partition, or with `spread` to the next partition in turn (every
    partition gets its share, whatever the users' skew)."""
    if abort_every == 1 or abort_every < 0:
        raise ValueError(f"abort_every: use 0 (no aborted transactions) or >= 2, got {abort_every}")
    if per_transaction < 1:
        raise ValueError(f"per_transaction: must be >= 1, got {per_transaction}")
    rng = random.Random(seed)
    users = _zipf_sampler(50_000, 1.1, rng)
    pages = _zipf_sampler(2_000, 1.2, rng)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"pageviews-{uuid.uuid4().hex}",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions(60)
    oracle = Oracle()
    clock = first_event_time(int(time.time() * 1000), messages, per_transaction, abort_every)
    sent = itertools.count()
    for n, abort in transactions(messages, per_transaction, abort_every):
        views: list[PageView] = []
        spots: list[int] = []
        for u, p in zip(users(n), pages(n), strict=True):
            clock += rng.randint(0, MAX_STEP_MS)
            views.append(PageView(f"user-{u}", f"/page/{p}", clock, rng.randint(20, 4_000)))
            spots.append(next(sent) % partitions if spread else u % partitions)
        values = [_value(view) for view in views]  # encoded once, whatever the attempts
        for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
            producer.begin_transaction()
            delivered = _send(producer, topic, views, values, spots)
            why = None if abort else unconfirmed(delivered, n)
            if abort or why is not None:
                # aborted on purpose, or a record's delivery unconfirmed: nothing of it is committed
                producer.abort_transaction(60)
                oracle.aborted += n
            if why is None:
                break
            if attempt == TRANSACTION_ATTEMPTS:
                raise RuntimeError(
                    f"pageviews: a transaction of {n} records to {topic} was aborted {attempt} times: {why}"
                )
            logger.warning(
                "pageviews: a transaction of %d records to %s aborted and sent again: %s", n, topic, why
            )
        if not abort:
            producer.commit_transaction(60)
            for view in views:
                oracle.add(view)
            oracle.value_bytes += sum(map(len, values))
        if progress is not None:
            progress(oracle.messages)
    return oracle
