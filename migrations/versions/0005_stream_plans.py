"""stream_plans: the ranges of the batch a Structured Streaming query of the job is running

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 15:00:00

The ``txn_offsets`` streaming source writes a job's row when it plans a batch (tagged with the
run's generation and the one stream reader that owns it); the exactly-once sink reads it, commits
exactly those ranges with the batch's results and marks the row committed in the same
transaction. One row per job: a query runs its batches one after the other.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "stream_plans",
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("reader", sa.Text, nullable=False),
        sa.Column("ranges", postgresql.JSONB, nullable=False),
        sa.Column("committed", sa.Boolean, nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["job"], [f"{schema}.jobs.job"], name="stream_plans_job_fkey"),
        sa.PrimaryKeyConstraint("job", name="stream_plans_pkey"),
        schema=schema,
    )


def downgrade() -> None:
    op.drop_table("stream_plans", schema=_schema())
