"""example result tables

Revision ID: e0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "e0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = "txn_examples"


def upgrade() -> None:
    op.create_table(
        "topic_metrics",
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("records", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        schema=SCHEMA,
    )
    op.create_table(
        "window_counts",
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("page", sa.Text, primary_key=True),
        sa.Column("views", sa.BigInteger, nullable=False),
        sa.Column("duration_ms", sa.BigInteger, nullable=False),
        schema=SCHEMA,
    )
    op.create_table(
        "top_keys",
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("batch_id", sa.Text, primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
        schema=SCHEMA,
    )
    op.create_table(
        "events",
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("off", sa.BigInteger, primary_key=True),
        sa.Column("key", sa.Text),
        sa.Column("page", sa.Text),
        sa.Column("event_time", sa.DateTime(timezone=True)),
        schema=SCHEMA,
    )


def downgrade() -> None:
    for table in ("events", "top_keys", "window_counts", "topic_metrics"):
        op.drop_table(table, schema=SCHEMA)
