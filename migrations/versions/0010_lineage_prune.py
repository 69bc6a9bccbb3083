"""audit action lineage_prune: ``offsets prune`` records what lineage it deleted

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:00:00

``txn-offsets offsets prune`` deletes a job's ``commits`` rows (by count or by age) and writes one
``lineage_prune`` audit row per partition it pruned: ``old_off`` the first offset whose commit row
is gone, ``new_off`` the end of the last one. No offset moves. (The planner's own retention, a
run's bounded prune by age, is not audited: it is the configured retention at work.)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_ACTIONS = ("seed", "new_partition", "new_topic", "reset", "data_loss_skip", "import", "retire")
_NEW_ACTIONS = (*_OLD_ACTIONS, "lineage_prune")
_ACTION_CHECK = "offset_audit_action_known_check"  # the name 0003 gave it (schema.py's convention)


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
    _replace_action_check(_schema(), _NEW_ACTIONS)


def downgrade() -> None:
    schema = _schema()
    audit = sa.table("offset_audit", sa.column("action"), schema=schema)
    # the old constraint has no word for them, and they moved no offset: no other action fits
    op.execute(audit.delete().where(audit.c.action == "lineage_prune"))
    _replace_action_check(schema, _OLD_ACTIONS)
