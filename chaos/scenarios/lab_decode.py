"""The lab job's record decoder: :func:`chaos.faults.decode_user` without msgspec, which the packed job
environment does not hold (it carries txn_offsets' own requirements only).

A page view's user is its JSON ``u``; anything else is poison and rejects the range, as there. The
tasks import it from the zip of ``chaos/`` the lab job ships (:mod:`chaos.scenarios.lab`).
"""

from __future__ import annotations

import json

from chaos.faults import Decoded
from txn_offsets.kafka.records import Record

__all__ = ["decode_user"]


def decode_user(record: Record) -> Decoded:
    """(topic, partition, offset, user) of a page view record."""
    if record.value is None:
        raise ValueError("empty value")
    user = json.loads(record.value)["u"]
    if not isinstance(user, str):
        raise TypeError(f"u is {type(user).__name__}, not a string")
    return record.topic, record.partition, record.offset, user
