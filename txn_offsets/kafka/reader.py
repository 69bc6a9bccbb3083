"""Executor side: read exactly one offset range ``[start, until)`` of one partition.

The range ends when the consumer's *position* reaches ``until``, never by counting records:
offsets inside a range are not consecutive (transaction markers, records of aborted transactions
under read_committed, compaction). librdkafka moves the position past trailing control markers
(confluent-kafka >= 2.13.2 fixes an EOF position bug), so a range made only of markers ends too.

Consumers come from the per-process pool of :mod:`txn_offsets.kafka.consumers` (one idle consumer
per Kafka settings, with the metadata of the topics it reads fetched up front). Many small
ranges (of different partitions) are read together by :func:`read_ranges`: first with Kafka's own
Fetch, one request per leader (:mod:`txn_offsets.kafka.fetcher`), then what that leaves with one
librdkafka assignment, the partitions fetched side by side. :func:`read_in_order` is how a Spark
task reads its ranges (a commit task and a records task alike): small ones together, large ones
streamed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Generator, Iterator, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, KafkaReadError
from txn_offsets.kafka import fetcher, recreated
from txn_offsets.kafka.consumers import pool
from txn_offsets.kafka.records import Record, as_bytes, headers_of
from txn_offsets.ranges import OffsetRange
from txn_offsets.ranges import TopicPartition as TP

__all__ = ["read_in_order", "read_range", "read_ranges"]

logger = logging.getLogger(__name__)


def _position(consumer: Consumer, rng: OffsetRange) -> int:
    """librdkafka's position of the range's partition, -1 while it has none."""
    pos = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
    return int(pos) if pos is not None and pos >= 0 else -1


# Right after assign(), librdkafka may still answer position() with where a pooled consumer's
# previous read of the same partition ended - ahead of the new start - until it has taken the new
# assignment in (9 of 50 reassigns in a scratch loop on the stack). Trusted then, a range would end
# before a record of it was read, and its claim would commit it: a lost record. So a partition's
# position() is only used once it is *fresh*:
# a record or an end-of-partition event of it was delivered, or position() said "none yet"
# (librdkafka resets it when the new assignment starts).


def read_range(
    kafka: KafkaSettings,
    rng: OffsetRange,
    *,
    batch_size: int = 2000,
    poll_timeout_s: float = 0.2,
    stall_timeout_s: float = 60.0,
) -> Generator[Record, None, None]:
    """Yield every visible record of ``rng`` in offset order, then stop.

    Raises :class:`KafkaReadError` if a record outside the range is delivered, if Kafka reports an
    error (e.g. the start is no longer in the log), or if the position does not move for
    ``stall_timeout_s`` (broker gone) - never hangs.
    """
    if batch_size <= 0:
        raise ConfigError("batch_size", f"must be > 0, got {batch_size}")
    if stall_timeout_s <= 0:
        raise ConfigError("stall_timeout_s", f"must be > 0 seconds, got {stall_timeout_s}")
    if rng.empty:
        return
    _settle(kafka, [rng])
    consumer = pool.take(kafka, (rng.topic,))
    clean = False
    # per record: no attribute lookups that can be made once, no call that can be avoided (the
    # topic and partition are the range's: one partition is assigned), a Record built with
    # tuple.__new__ (NamedTuple's own __new__ is a Python-level function)
    topic, partition, until = rng.topic, rng.partition, rng.until
    consume = consumer.consume
    new = tuple.__new__
    record_type = Record
    try:
        consumer.assign([TopicPartition(topic, partition, rng.start)])
        position = rng.start
        fresh = False  # see above: position() is not used before
        polled_at = position  # the position at the last progress check
        last_progress = time.monotonic()
        while position < until:
            # what librdkafka has already fetched, without waiting; when that is nothing, wait for
            # the first message or event only. Never wait for a full batch: librdkafka's consume()
            # waits for all `num_messages` or the timeout, and the tail of a range can hold fewer
            # records than offsets (transaction markers, aborted records) - at a partition's end
            # (every range of a caught-up job) each range would pay the whole timeout.
            wanted = min(batch_size, until - position)
            messages = consume(wanted, 0)
            if not messages:
                messages = consume(1, poll_timeout_s)
            for msg in messages:
                err = msg.error()
                fresh = True
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue  # the position check below sees where the log ends
                    raise _read_error(rng, position, err)
                offset = msg.offset()
                if offset is None or offset < position:
                    raise KafkaReadError(
                        topic,
                        partition,
                        rng.start,
                        until,
                        f"offset {offset} delivered after position {position}: offsets must be monotonic",
                    )
                if offset >= until:
                    position = until
                    break
                key = msg.key()
                value = msg.value()
                if key.__class__ is not bytes and key is not None:
                    key = as_bytes(key)
                if value.__class__ is not bytes and value is not None:
                    value = as_bytes(value)
                ts_type, ts = msg.timestamp()
                headers = msg.headers()
                yield new(
                    record_type,
                    (
                        topic,
                        partition,
                        offset,
                        key,
                        value,
                        ts if ts_type and ts >= 0 else None,  # 0: TIMESTAMP_NOT_AVAILABLE
                        headers_of(headers) if headers else (),
                    ),
                )
                position = offset + 1
            if position < until:
                # the position moves past markers and aborted records that are never delivered
                reported = _position(consumer, rng)
                fresh = fresh or reported < 0
                position = max(position, reported) if fresh else position
            # progress is the position moving, not messages arriving: a consumer handed messages
            # that do not advance it is as stuck as one handed nothing
            if position > polled_at or position >= until:
                last_progress = time.monotonic()
                polled_at = position
            elif time.monotonic() - last_progress > stall_timeout_s:
                detail = _stalled(kafka, consumer, stall_timeout_s, position)
                raise KafkaReadError(topic, partition, rng.start, until, detail)
        clean = True
    finally:
        if clean:
            pool.give_back(kafka, consumer, assigned=1)
        else:  # an error, or the caller stopped reading early: its state is unknown
            pool.discard(consumer)


def read_ranges(
    kafka: KafkaSettings,
    ranges: Sequence[OffsetRange],
    *,
    batch_size: int = 2000,
    poll_timeout_s: float = 0.2,
    stall_timeout_s: float = 60.0,
) -> dict[TP, list[Record]]:
    """Every visible record of each of `ranges` (one range per partition), read together (Kafka's
    own Fetch, :func:`txn_offsets.kafka.fetcher.read_wide`; what it leaves with one librdkafka
    assignment); the records of each range in offset order, by (topic, partition).

    The same checks and errors as :func:`read_range`: a range ends when its partition's position
    reaches its end; a record outside it, a Kafka error or no progress for ``stall_timeout_s`` is a
    KafkaReadError. All the records are held in memory: meant for small ranges.
    """
    if batch_size <= 0:
        raise ConfigError("batch_size", f"must be > 0, got {batch_size}")
    if stall_timeout_s <= 0:
        raise ConfigError("stall_timeout_s", f"must be > 0 seconds, got {stall_timeout_s}")
    out: dict[TP, list[Record]] = {r.key: [] for r in ranges}
    if len(out) != len(ranges):
        raise ConfigError("ranges", "read_ranges reads one range per partition")
    todo = {r.key: r for r in ranges if not r.empty}
    if not todo:
        return out
    _settle(kafka, list(todo.values()))
    read, rest = fetcher.read_wide(kafka, list(todo.values()))  # Kafka's own Fetch first
    out.update(read)
    todo = {r.key: r for r in rest}  # what it left: librdkafka reads it
    if todo:
        _consume(
            kafka,
            todo,
            out,
            batch_size=batch_size,
            poll_timeout_s=poll_timeout_s,
            stall_timeout_s=stall_timeout_s,
        )
    return out


#: Small ranges are read together (:func:`read_in_order`), up to this many offsets at a time (held
#: in memory until their caller takes them); a larger range is streamed on its own.
TOGETHER_MAX_OFFSETS = 50_000


def read_in_order(
    kafka: KafkaSettings,
    ranges: Sequence[OffsetRange],
    *,
    batch_size: int = 2000,
    stall_timeout_s: float = 60.0,
) -> Iterator[tuple[OffsetRange, Iterator[Record]]]:
    """Each of `ranges` (one per partition) with its records, in the given order: the small ranges
    at the head of what is left read together (:func:`read_ranges`: one Kafka Fetch for all of
    them, not an assignment and a fetch round trip per range), at most TOGETHER_MAX_OFFSETS offsets
    at a time; a range that does not fit with the next one streamed on its own (:func:`read_range`).
    The caller reads each range's records before it asks for the next range."""
    fetched: dict[TP, list[Record]] = {}
    for i, rng in enumerate(ranges):
        if rng.key not in fetched:
            fetched = _together(kafka, ranges[i:], batch_size, stall_timeout_s)
        records = fetched.pop(rng.key, None)
        if records is not None:
            yield rng, iter(records)
        else:
            yield rng, read_range(kafka, rng, batch_size=batch_size, stall_timeout_s=stall_timeout_s)


def _together(
    kafka: KafkaSettings, rest: Sequence[OffsetRange], batch_size: int, stall_timeout_s: float
) -> dict[TP, list[Record]]:
    """The records of the small ranges at the head of `rest`, read together; {} when fewer than
    two fit in TOGETHER_MAX_OFFSETS (the next range is streamed on its own)."""
    spans = itertools.accumulate(r.span for r in rest)
    head = [r for r, total in zip(rest, spans, strict=False) if total <= TOGETHER_MAX_OFFSETS]
    if len(head) < 2:
        return {}
    return read_ranges(kafka, head, batch_size=batch_size, stall_timeout_s=stall_timeout_s)


def _consume(
    kafka: KafkaSettings,
    todo: dict[TP, OffsetRange],
    out: dict[TP, list[Record]],
    *,
    batch_size: int,
    poll_timeout_s: float,
    stall_timeout_s: float,
) -> None:
    """:func:`read_ranges`' reading of the ranges `todo` with one librdkafka assignment, each
    range's records appended to its list in `out`."""
    position = {k: r.start for k, r in todo.items()}
    assigned = len(todo)
    fresh: set[TP] = set()  # partitions whose position() is used (see above)
    consumer = pool.take(kafka, {r.topic for r in todo.values()}, small=True)
    clean = False
    resume: list[TopicPartition] = []  # a pause outlives the assignment: resumed before pooling
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in todo.values()])
        last_progress = time.monotonic()
        ended: set[TP] = set()  # partitions whose end of log was delivered
        waiting: set[TP] = set()  # of those, the ones whose range is still open
        quiet_since = time.monotonic()  # when a record of an open range was last delivered
        # the work of one pass is that of what it was handed (records, events, positions asked),
        # never a scan of every open range: a read of 2,048 ranges is handed its records a few at a
        # time, and a scan per pass made such a read quadratic
        while todo:
            messages = consumer.consume(batch_size, 0) or consumer.consume(1, poll_timeout_s)
            moved: set[TP] = set()  # open ranges whose position moved in this pass
            for msg in messages:
                err = msg.error()
                rng = todo.get(tp_key := (str(msg.topic()), int(msg.partition() or 0)))
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        at = rng or next(iter(todo.values()))  # an error of no partition: of the read
                        raise _read_error(at, position[at.key], err)
                    fresh.add(tp_key)
                    ended.add(tp_key)
                    if rng is not None:
                        waiting.add(tp_key)
                    continue
                if rng is None:
                    continue  # a range complete (prefetched past its end)
                key = rng.key
                fresh.add(key)
                offset = msg.offset()
                if offset is None or offset < position[key]:
                    detail = (
                        f"offset {offset} delivered after position {position[key]}: offsets must be monotonic"
                    )
                    raise KafkaReadError(rng.topic, rng.partition, rng.start, rng.until, detail)
                moved.add(key)
                if offset >= rng.until:
                    position[key] = rng.until
                    continue
                ts_type, ts = msg.timestamp()
                headers = msg.headers()
                out[key].append(
                    Record(
                        rng.topic,
                        rng.partition,
                        offset,
                        as_bytes(msg.key()),
                        as_bytes(msg.value()),
                        ts if ts_type and ts >= 0 else None,
                        headers_of(headers) if headers else (),
                    )
                )
                position[key] = offset + 1
            # positions move past markers and aborted records that are never delivered: asked
            # of the open partitions whose log end was delivered, and of every open one when
            # nothing was delivered or no open range moved for POSITION_AFTER_S - then at most
            # once per POSITION_AFTER_S (records still to come move them themselves; position()
            # of 2,048 partitions took 50 ms under load)
            now = time.monotonic()
            if moved:
                quiet_since = now
            if not messages or now - quiet_since > POSITION_AFTER_S:
                asked = [k for k, r in todo.items() if position[k] < r.until]
                quiet_since = now
            else:
                asked = [k for k in waiting if position[k] < todo[k].until]
            for tp in consumer.position([TopicPartition(t, p) for t, p in asked]) if asked else []:
                key = (tp.topic, tp.partition)
                if tp.offset is None or tp.offset < 0:
                    fresh.add(key)  # reset: the new assignment has started (see above)
                elif key in fresh and tp.offset > position[key]:
                    position[key] = tp.offset
                    moved.add(key)
            done = [k for k in sorted(moved) if position[k] >= todo[k].until]
            paused = _worth_pausing(consumer, [todo[k] for k in done if k not in ended])
            if paused:
                consumer.pause(paused)
                resume += paused
            for k in done:
                del todo[k]
                waiting.discard(k)
            # progress is a position moving (positions never move back)
            if moved or not todo:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                rng = next(iter(todo.values()))
                detail = _stalled(kafka, consumer, stall_timeout_s, position[rng.key])
                raise KafkaReadError(rng.topic, rng.partition, rng.start, rng.until, detail)
        if resume:
            consumer.resume(resume)
        clean = True
    finally:
        if clean:
            pool.give_back(kafka, consumer, assigned=assigned, small=True)
        else:  # an error: the consumer's state is unknown
            pool.discard(consumer)


#: how long a read waits for a broker that names another id for its topic (:func:`_settle`)
SETTLE_TIMEOUT_S = 10.0


def _settle(kafka: KafkaSettings, ranges: Sequence[OffsetRange]) -> None:
    """Read nothing while a broker this process reaches names another id for a topic of `ranges`
    (a broker behind the cluster's metadata serves the deleted topic's log to a reader that took its
    id): the planner's barrier asked from the driver; asked here again, once per process and topic
    id (:func:`txn_offsets.kafka.recreated.settle`), because an executor may reach a broker the
    driver cannot. ServiceUnavailable after SETTLE_TIMEOUT_S: the task fails, the batch is planned
    again. A topic whose planned id no broker names any more is read: the commit's proof refuses it
    (TopicChanged), as for any topic re-created after its plan."""
    ids = {r.topic: r.topic_id for r in ranges if r.topic_id is not None}
    if ids:
        recreated.settle(kafka, ids, timeout_s=SETTLE_TIMEOUT_S, gone="proof")


#: A complete range's partition is paused (its fetching stops) unless at most this many offsets
#: follow the range in its log (librdkafka's cached high watermark): a pause is one librdkafka op
#: per partition, each answered by its broker thread - 2,048 took 0.9-1.0 s of a 2.4 s read of 2,048
#: ranges of 2 records under load - while a few records past a range cost next to nothing.
PAUSE_MIN_LEFT = 100
#: :func:`read_ranges` asks every open partition's position once no open range moved this long
POSITION_AFTER_S = 0.05


def _worth_pausing(consumer: Consumer, done: list[OffsetRange]) -> list[TopicPartition]:
    """The partitions of the complete ranges `done` worth pausing: more than PAUSE_MIN_LEFT
    offsets left in the log past the range, or not known (no watermark cached yet). A partition
    whose log end was delivered is left out by the caller: nothing is left to fetch there."""
    out = []
    for rng in done:
        tp = TopicPartition(rng.topic, rng.partition)
        try:
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            high = -1
        if high is None or high < 0 or high - rng.until > PAUSE_MIN_LEFT:
            out.append(tp)
    return out


def _stalled(kafka: KafkaSettings, consumer: Consumer, stall_timeout_s: float, position: int) -> str:
    """A read that did not move: why, if librdkafka said (connection refused, ...), else what to check."""
    why = pool.failures(consumer, stall_timeout_s) or (
        f"is the broker at {kafka.bootstrap_servers} reachable? was the range planned past the end offset?"
    )
    return f"no progress for {stall_timeout_s:.0f}s at offset {position} ({why})"


def _read_error(rng: OffsetRange, position: int, err: KafkaError) -> KafkaReadError:
    if err.code() == KafkaError._AUTO_OFFSET_RESET:
        detail = (
            f"offset {position} is no longer in the log (deleted by retention?); the job's "
            f"on_data_loss policy decides what happens at the next plan"
        )
    else:
        detail = f"{err.name()}: {err.str()}"
    return KafkaReadError(rng.topic, rng.partition, rng.start, rng.until, detail)
