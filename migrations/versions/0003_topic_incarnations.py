"""topic incarnations and first plans: offsets.topic_id, jobs.first_plan_at, audit action new_topic

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 12:00:00

* ``offsets.topic_id``: the Kafka topic id (a UUID, as text) the stored offset belongs to. A topic
  deleted and re-created under the same name gets a new id: the stored offset then says nothing
  about the new log, and the planner treats it as data loss instead of "caught up".
* ``jobs.first_plan_at``: when the job planned for the first time. The start policy applies to the
  topics of that first plan only; a topic that appears later starts at its log start (``new_topic``).
  Jobs that already have offsets are backfilled (they have planned).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_ACTIONS = ("seed", "new_partition", "reset", "data_loss_skip", "import")
_NEW_ACTIONS = ("seed", "new_partition", "new_topic", "reset", "data_loss_skip", "import")


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def _action_check(actions: tuple[str, ...]) -> str:
    return "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")"


# 0001 passed an already-prefixed name through the naming convention, so the check is named
# offset_audit_offset_audit_action_known_check_check in existing databases; schema.py's name is
# offset_audit_action_known_check. Drop whichever exists (the schema name was validated by env.py).
_ACTION_CHECK_NAMES = (
    "offset_audit_offset_audit_action_known_check_check",
    "offset_audit_action_known_check",
)


def _drop_action_check(schema: str) -> None:
    for name in _ACTION_CHECK_NAMES:
        op.execute(f'ALTER TABLE "{schema}".offset_audit DROP CONSTRAINT IF EXISTS "{name}"')


def upgrade() -> None:
    schema = _schema()
    op.add_column("offsets", sa.Column("topic_id", sa.Text(), nullable=True), schema=schema)
    op.add_column(
        "jobs", sa.Column("first_plan_at", sa.DateTime(timezone=True), nullable=True), schema=schema
    )
    jobs = sa.table("jobs", sa.column("job"), sa.column("first_plan_at"), schema=schema)
    offsets = sa.table("offsets", sa.column("job"), sa.column("updated_at"), schema=schema)
    op.execute(
        jobs.update()
        .where(jobs.c.first_plan_at.is_(None))
        .values(
            first_plan_at=sa.select(sa.func.min(offsets.c.updated_at))
            .where(offsets.c.job == jobs.c.job)
            .scalar_subquery()
        )
    )
    _drop_action_check(schema)
    op.create_check_constraint(
        op.f(_ACTION_CHECK_NAMES[1]), "offset_audit", _action_check(_NEW_ACTIONS), schema=schema
    )


def downgrade() -> None:
    schema = _schema()
    audit = sa.table("offset_audit", sa.column("action"), schema=schema)
    # the old constraint does not know 'new_topic': record those rows as the seeds they are
    op.execute(audit.update().where(audit.c.action == "new_topic").values(action="seed"))
    _drop_action_check(schema)
    op.create_check_constraint(
        op.f(_ACTION_CHECK_NAMES[0]), "offset_audit", _action_check(_OLD_ACTIONS), schema=schema
    )
    op.drop_column("jobs", "first_plan_at", schema=schema)
    op.drop_column("offsets", "topic_id", schema=schema)
