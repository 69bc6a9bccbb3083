"""Data loss: a stored offset that no longer points into its topic's log, and what a plan does
about it (``on_data_loss``). Pure decisions, no I/O: the planner applies them.

A stored offset is a claim about one incarnation of a topic (its Kafka topic id is stored with
it). Data loss is any stored offset below the log start (retention), above the end (truncation),
or of another topic id (the topic deleted and re-created). It raises ``DataLoss`` by default
("fail"), or is an audited skip ("skip").
"""

from __future__ import annotations

from typing import Literal, get_args

from txn_offsets.errors import ConfigError
from txn_offsets.errors.batch import DataLossKind
from txn_offsets.store.offset_rows import StoredOffset

__all__ = ["LOSS_REASONS", "ON_DATA_LOSS", "OnDataLoss", "check_on_data_loss", "lost"]

# what a plan does about data loss: raise DataLoss ("fail") or move on, audited ("skip")
OnDataLoss = Literal["fail", "skip"]
ON_DATA_LOSS: tuple[OnDataLoss, ...] = get_args(OnDataLoss)


def check_on_data_loss(value: object) -> OnDataLoss:
    """`value` as an OnDataLoss, or a ConfigError naming ``on_data_loss``."""
    for policy in ON_DATA_LOSS:
        if value == policy:
            return policy
    raise ConfigError("on_data_loss", f"{value!r}: use 'fail' (default) or 'skip'")


# the audit reason of a skip, per kind
LOSS_REASONS = {
    "retention": "records [{stored}, {resume}) deleted from Kafka before processing",
    "truncated": "stored offset {stored} above the log end {resume} (log truncated); continuing at the end",
    "recreated": "topic re-created (topic id {old_id} -> {new_id}); offset {stored} was of the old topic, "
    "continuing at the new log start {resume}",
}


def lost(row: StoredOffset, topic_id: str, marks: tuple[int, int]) -> tuple[DataLossKind, int] | None:
    """(kind, where a skip continues) if the stored offset no longer points into the topic's log.

    A stored offset is a claim about ONE incarnation of the topic: a new topic id means the topic
    was re-created (even when the new log has already grown past the offset); an offset above the
    end means the log was truncated under it. Either way reading on from it would skip records
    without a word, so it is data loss, never "caught up".
    """
    low, end = marks
    if row.topic_id is not None and row.topic_id != topic_id:
        return "recreated", low
    if row.off > end:
        return "truncated", end
    if row.off < low:
        return "retention", low
    return None
