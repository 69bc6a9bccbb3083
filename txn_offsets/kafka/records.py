"""One Kafka record as the user's code sees it, whichever client read it."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Headers", "Record", "as_bytes", "headers_of"]

Headers = tuple[tuple[str, bytes | None], ...]


class Record(NamedTuple):
    """One Kafka record as the user's code sees it (cheap to pickle between Spark stages)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    headers: Headers = ()


def headers_of(headers: Any) -> Headers:
    """librdkafka's list of (name, value) as a record's headers."""
    return tuple((str(k), as_bytes(v)) for k, v in headers)


def as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()
