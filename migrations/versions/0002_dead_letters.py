"""dead_letters: records a decoder rejected, kept in the range's transaction

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("off", sa.BigInteger, nullable=False),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("value", sa.LargeBinary, nullable=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("job", "topic", "part", "off", name="dead_letters_pkey"),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("dead_letters", schema=_schema())
