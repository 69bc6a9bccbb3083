"""Executor side, low-latency mode: one consumer that follows a set of partitions continuously.

:func:`txn_offsets.kafka.reader.read_range` reads one planned range and stops; a follower is
assigned its partitions at their stored offsets and polls for as long as its task runs, handing
back whatever arrived (in offset order per partition) and, per partition, the *position*: the
next offset to read, which moves past transaction markers and aborted records that are never
delivered. A range ``[committed, position)`` therefore holds exactly the records handed back
since the last commit, however many offsets they leave out.

The same consumer settings as a range read (read_committed, ``auto.offset.reset=error``: a start
no longer in the log is an error, never a silent jump), with a small ``fetch.wait.max.ms``: a
follower sits at the log's end, where the broker holds each fetch that long for new data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError, KafkaReadError
from txn_offsets.kafka.clients import client_config
from txn_offsets.kafka.consumers import consumer_config
from txn_offsets.kafka.records import Record, as_bytes, headers_of
from txn_offsets.ranges import TopicPartition as Key

__all__ = ["Follower"]


class Follower:
    """A consumer assigned to `start` (partition -> next offset to read) until :meth:`close`."""

    def __init__(
        self,
        kafka: KafkaSettings,
        start: Mapping[Key, int],
        *,
        fetch_wait_ms: int = 5,
        batch_size: int = 2000,
    ) -> None:
        if not start:
            raise ConfigError("partitions", "a follower needs at least one partition")
        if batch_size <= 0:
            raise ConfigError("batch_size", f"must be > 0, got {batch_size}")
        config = consumer_config(kafka)
        if "fetch.wait.max.ms" not in kafka.extra:  # the user's setting wins, as for range reads
            config["fetch.wait.max.ms"] = fetch_wait_ms
        self._consumer: Any = Consumer(client_config(config))
        self._batch_size = batch_size
        self._positions: dict[Key, int] = dict(start)
        self._parts = [TopicPartition(t, p) for t, p in start]
        self._consumer.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        self.full = False  # the last poll returned a full batch: more is waiting (a backlog)

    @property
    def positions(self) -> dict[Key, int]:
        """The next offset to read per partition (everything below it was handed back)."""
        return dict(self._positions)

    def poll(self, timeout_s: float) -> list[Record]:
        """What has arrived, waiting at most `timeout_s` for the first record or event (0: no wait).
        Raises KafkaReadError on a Kafka error (e.g. an offset no longer in the log)."""
        consume = self._consumer.consume
        messages = consume(self._batch_size, 0)
        if not messages and timeout_s > 0:
            messages = consume(1, timeout_s)
        self.full = len(messages) >= self._batch_size
        out: list[Record] = []
        append = out.append
        positions = self._positions
        new, record_type = tuple.__new__, Record  # per record: as read_range does (no NamedTuple __new__)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise self._error(msg, err)
            key = (msg.topic(), msg.partition())
            offset = msg.offset()
            if offset is None or offset < positions[key]:
                raise KafkaReadError(
                    key[0], key[1], positions[key], positions[key], f"offset {offset} delivered out of order"
                )
            k, v = msg.key(), msg.value()
            if k.__class__ is not bytes and k is not None:
                k = as_bytes(k)
            if v.__class__ is not bytes and v is not None:
                v = as_bytes(v)
            ts_type, ts = msg.timestamp()
            headers = msg.headers()
            append(
                new(
                    record_type,
                    (
                        key[0],
                        key[1],
                        offset,
                        k,
                        v,
                        ts if ts_type and ts >= 0 else None,
                        headers_of(headers) if headers else (),
                    ),
                )
            )
            positions[key] = offset + 1
        # the position moves past markers and aborted records that are never delivered
        for tp in self._consumer.position(self._parts):
            key = (tp.topic, tp.partition)
            if tp.offset is not None and tp.offset > positions[key]:
                positions[key] = int(tp.offset)
        return out

    def _error(self, msg: Any, err: KafkaError) -> KafkaReadError:
        topic, partition = msg.topic() or "?", msg.partition()
        position = self._positions.get((topic, partition), -1)
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            detail = (
                f"offset {position} is no longer in the log (deleted by retention?); the job's "
                f"on_data_loss policy decides what happens at the next plan"
            )
        else:
            detail = f"{err.name()}: {err.str()}"
        part = partition if partition is not None and partition >= 0 else -1
        return KafkaReadError(topic, part, position, position, detail)

    def close(self) -> None:
        self._consumer.close()
