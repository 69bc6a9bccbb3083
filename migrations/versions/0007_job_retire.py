"""job retirement: jobs.retired_at and the audit action retire

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:00:00

``txn-offsets jobs retire --job J`` sets ``jobs.retired_at`` (the job then counts as retired until
a run starts after it: ``jobs list`` hides it unless ``--all``) and writes one ``retire`` audit row
per offset row, in the transaction that bumps the generation. ``--drop-rows`` also deletes the
job's offsets, statistics and stream plan; the job row stays, so a later run of the same name never
reuses a generation an old run was fenced at.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_ACTIONS = ("seed", "new_partition", "new_topic", "reset", "data_loss_skip", "import")
_NEW_ACTIONS = (*_OLD_ACTIONS, "retire")
# the name 0003 gave the check (schema.py's naming convention)
_ACTION_CHECK = "offset_audit_action_known_check"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return str(schema)


def _replace_action_check(schema: str, actions: tuple[str, ...]) -> None:
    # the schema name was validated by env.py; the actions are constants
    op.execute(f'ALTER TABLE "{schema}".offset_audit DROP CONSTRAINT IF EXISTS "{_ACTION_CHECK}"')
    check = "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")"
    op.create_check_constraint(op.f(_ACTION_CHECK), "offset_audit", check, schema=schema)


def upgrade() -> None:
    schema = _schema()
    op.add_column("jobs", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True), schema=schema)
    _replace_action_check(schema, _NEW_ACTIONS)


def downgrade() -> None:
    schema = _schema()
    audit = sa.table("offset_audit", sa.column("action"), schema=schema)
    # the old constraint does not know 'retire': those rows recorded a position, as a reset does
    op.execute(audit.update().where(audit.c.action == "retire").values(action="reset"))
    _replace_action_check(schema, _OLD_ACTIONS)
    op.drop_column("jobs", "retired_at", schema=schema)
