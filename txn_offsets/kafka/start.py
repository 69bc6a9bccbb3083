"""Where a job starts on partitions it has never seen: earliest, latest, a timestamp, or explicit offsets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.kafka import metadata
from txn_offsets.ranges import TopicPartition

__all__ = ["StartPolicy"]

_KINDS = ("earliest", "latest", "timestamp", "explicit")


@dataclass(frozen=True)
class StartPolicy:
    """Use the constructors: ``earliest()``, ``latest()``, ``at_timestamp(ms)``, ``explicit({...})``.

    ``explicit`` maps (topic, partition) to an offset; partitions it does not name start at earliest.
    """

    kind: str
    timestamp_ms: int | None = None
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError("start", f"{self.kind!r} is not a start policy; use one of {', '.join(_KINDS)}")
        if self.kind == "timestamp" and (self.timestamp_ms is None or self.timestamp_ms < 0):
            raise ConfigError("start", "at_timestamp needs milliseconds since the epoch (>= 0)")
        for (topic, part), off in self.offsets.items():
            if part < 0 or off < 0:
                raise ConfigError("start", f"explicit offset {off} for {topic}[{part}] must be >= 0")
        object.__setattr__(self, "offsets", MappingProxyType(dict(self.offsets)))

    @classmethod
    def earliest(cls) -> StartPolicy:
        return cls("earliest")

    @classmethod
    def latest(cls) -> StartPolicy:
        return cls("latest")

    @classmethod
    def at_timestamp(cls, timestamp_ms: int) -> StartPolicy:
        return cls("timestamp", timestamp_ms=timestamp_ms)

    @classmethod
    def explicit(cls, offsets: Mapping[TopicPartition, int]) -> StartPolicy:
        return cls("explicit", offsets=offsets)

    @classmethod
    def parse(cls, text: str) -> StartPolicy:
        """From a CLI/env value: ``earliest``, ``latest`` or ``timestamp:<ms>``."""
        if text in ("earliest", "latest"):
            return cls(text)
        if text.startswith("timestamp:") and text[10:].isdigit():
            return cls.at_timestamp(int(text[10:]))
        raise ConfigError("start", f"{text!r}: use earliest, latest or timestamp:<milliseconds>")

    def resolve(
        self,
        kafka: KafkaSettings,
        partitions: Sequence[TopicPartition],
        marks: Mapping[TopicPartition, tuple[int, int]],
        *,
        timeout_s: float = 10.0,
    ) -> dict[TopicPartition, int]:
        """Offsets to seed for `partitions`, given their (log start, end) watermarks."""
        if self.kind == "earliest":
            return {tp: marks[tp][0] for tp in partitions}
        if self.kind == "latest":
            return {tp: marks[tp][1] for tp in partitions}
        if self.kind == "timestamp" and self.timestamp_ms is not None:  # always set: __post_init__
            return metadata.offsets_for_time(kafka, partitions, self.timestamp_ms, timeout_s=timeout_s)
        out: dict[TopicPartition, int] = {}
        for tp in partitions:
            low, end = marks[tp]
            off = self.offsets.get(tp, low)
            if not low <= off <= end:
                raise ConfigError(
                    "start", f"explicit offset {off} for {tp[0]}[{tp[1]}] is outside the log [{low}, {end}]"
                )
            out[tp] = off
        return out
