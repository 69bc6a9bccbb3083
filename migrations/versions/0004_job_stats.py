"""job_stats: per job batch statistics for `txn-offsets serve` (duration histogram, outcome counters)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 13:00:00

Written by the runner after each batch in its own short transaction (``txn_offsets.store.stats``);
read by the metrics service. No foreign key to ``jobs``: writing a counter never locks a job row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

# frozen copy of schema.STAT_OUTCOMES at this revision (migrations never import the live models)
_OUTCOMES = ("committed", "already_committed", "conflict", "fenced", "rejected", "data_loss", "mirror_failed")


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def upgrade() -> None:
    op.create_table(
        "job_stats",
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("batches", sa.BigInteger, server_default=sa.text("0"), nullable=False),
        sa.Column("batch_seconds_sum", sa.Double, server_default=sa.text("0"), nullable=False),
        sa.Column("batch_buckets", sa.ARRAY(sa.BigInteger), nullable=False),
        *[sa.Column(name, sa.BigInteger, server_default=sa.text("0"), nullable=False) for name in _OUTCOMES],
        sa.Column("last_batch_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("batches >= 0", name="job_stats_batches_nonneg_check"),
        sa.PrimaryKeyConstraint("job", name="job_stats_pkey"),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("job_stats", schema=_schema())
