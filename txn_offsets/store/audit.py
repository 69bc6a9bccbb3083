"""The audit side of offset moves: what one move is, who makes it, the checks every audited move
passes, and the rows of the ``offset_audit`` table (in the caller's transaction, never committed
here). Every offset change that is not a batch commit goes through here."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

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
    # one statement over bound arrays (an executemany of 4,096 rows: ~2 s, a statement each)
    rows = (
        sa.func.unnest(
            sa.cast(sa.literal([c.topic for c in changes], ARRAY(sa.Text)), ARRAY(sa.Text)),
            sa.cast(sa.literal([c.partition for c in changes], ARRAY(sa.Integer)), ARRAY(sa.Integer)),
            sa.cast(sa.literal([c.old for c in changes], ARRAY(sa.BigInteger)), ARRAY(sa.BigInteger)),
            sa.cast(sa.literal([c.new for c in changes], ARRAY(sa.BigInteger)), ARRAY(sa.BigInteger)),
        )
        .table_valued("topic", "part", "old_off", "new_off")
        .render_derived()
    )
    fixed = [sa.literal(v) for v in (job, action, reason, actor)]
    conn.execute(
        sa.insert(audit).from_select(
            ["job", "topic", "part", "old_off", "new_off", "action", "reason", "actor", "generation"],
            sa.select(
                fixed[0],
                rows.c.topic,
                rows.c.part,
                rows.c.old_off,
                rows.c.new_off,
                *fixed[1:],
                sa.cast(sa.literal(generation), sa.BigInteger),
            ),
        )
    )
