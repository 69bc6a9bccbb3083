"""Record timestamps at stored positions: how old the oldest unprocessed record is (lag in seconds).

For each partition the timestamp of the first record a reader gets at or after a position (at the
readers' isolation level, so aborted records and markers are passed over as the job passes them).
Only timestamps leave this module: keys and values are fetched by the consumer but never read,
logged or kept. Fetches are capped small, as one record per partition is all that is needed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka.clients import client_config
from txn_offsets.kafka.consumers import consumer_config
from txn_offsets.ranges import TopicPartition

__all__ = ["first_timestamps"]

logger = logging.getLogger(__name__)

_NOT_FOUND = (KafkaError._PARTITION_EOF, KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET)


def _config(kafka: KafkaSettings) -> dict[str, object]:
    return {
        **consumer_config(kafka),
        # one record per partition is enough: the broker still returns at least one batch
        "max.partition.fetch.bytes": 1,
        "fetch.max.bytes": 1024 * 1024,
        "queued.max.messages.kbytes": 1024,
    }


def first_timestamps(
    kafka: KafkaSettings, positions: Mapping[TopicPartition, int], *, timeout_s: float = 10.0
) -> dict[TopicPartition, int | None]:
    """Per partition: the timestamp (ms since the epoch) of the first record at or after the
    position, or None when there is none before the end (or none arrived within `timeout_s`)."""
    out: dict[TopicPartition, int | None] = dict.fromkeys(positions)
    if not positions:
        return out
    try:
        consumer = Consumer(client_config(_config(kafka)))
    except KafkaException as exc:
        raise ServiceUnavailable("Kafka", kafka.bootstrap_servers, str(exc)) from None
    pending = set(positions)
    try:
        consumer.assign([KafkaTP(t, p, off) for (t, p), off in sorted(positions.items())])
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(0.01, deadline - time.monotonic())))
            if msg is None:
                continue
            key = (msg.topic() or "", msg.partition() or 0)
            err = msg.error()
            if err is not None:
                if err.code() in _NOT_FOUND and key in pending:
                    pending.discard(key)
                    consumer.pause([KafkaTP(*key)])
                elif err.code() not in _NOT_FOUND:
                    logger.debug("timestamps: %s on %s[%s]", err.name(), key[0], key[1])
                continue
            if key in pending:
                _kind, ts = msg.timestamp()
                out[key] = ts if ts is not None and ts >= 0 else None
                pending.discard(key)
                consumer.pause([KafkaTP(*key)])
        if pending:
            logger.debug("timestamps: no record from %r partition(s) within %ss", len(pending), timeout_s)
    finally:
        consumer.close()
    return out
