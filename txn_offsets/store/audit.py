"""The audit side of offset moves: what one move is, who makes it, the checks every audited move
passes, and the rows of the ``offset_audit`` table (in the caller's transaction, never committed
here). Every offset change that is not a batch commit goes through here."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.ranges import TopicPartition
from txn_offsets.store.schema import AUDIT_ACTIONS, tables_for

__all__ = ["OffsetChange", "check_audit", "check_offsets", "default_actor", "write_audit"]


@dataclass(frozen=True)
class OffsetChange:
    """One audited move of a stored offset (``old`` None: the row did not exist)."""

    topic: str
    partition: int
    old: int | None
    new: int


def default_actor() -> str:
    """Who is acting, for the audit table: OS user at host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers) and no LOGNAME/USER
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def check_offsets(offsets: Mapping[TopicPartition, int]) -> None:
    """Topic names, partitions and offsets as the tables accept them, or a ConfigError naming it."""
    for (topic, part), off in offsets.items():
        if not isinstance(topic, str) or not topic:
            raise ConfigError("topic", f"{topic!r} is not a topic name")
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise ConfigError("partition", f"{part!r} of topic {topic!r} must be an integer >= 0")
        if isinstance(off, bool) or not isinstance(off, int) or off < 0:
            raise ConfigError("offset", f"{off!r} for {topic}[{part}] must be an integer >= 0")


def check_audit(action: str, reason: str, actor: str) -> None:
    """A known action, a reason and an actor: the audit row must say what, why and who."""
    if action not in AUDIT_ACTIONS:
        raise ConfigError("action", f"{action!r}: use one of {', '.join(AUDIT_ACTIONS)}")
    if not reason or not reason.strip():
        raise ConfigError("reason", "is empty; say why the offsets move (it goes to the audit table)")
    if not actor or not actor.strip():
        raise ConfigError("actor", "is empty; say who moves the offsets")


def write_audit(
    conn: sa.Connection,
    db: DatabaseSettings,
    job: str,
    changes: Sequence[OffsetChange],
    *,
    action: str,
    reason: str,
    actor: str,
    generation: int | None,
) -> None:
    """One audit row per change."""
    if not changes:
        return
    audit = tables_for(db.schema).audit
    conn.execute(
        sa.insert(audit),
        [
            {
                "job": job,
                "topic": c.topic,
                "part": c.partition,
                "old_off": c.old,
                "new_off": c.new,
                "action": action,
                "reason": reason,
                "actor": actor,
                "generation": generation,
            }
            for c in changes
        ],
    )
