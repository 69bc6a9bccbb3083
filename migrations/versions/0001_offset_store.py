"""offset store: jobs, offsets, offset_audit

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

A frozen snapshot of txn_offsets/schema.py at this revision (migrations never import the live
models: a later change to them must come with a new revision, which `alembic check` enforces).
The schema name is chosen at run time (see migrations/env.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.DateTime(timezone=True)


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "jobs",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("generation", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("run_host", sa.Text(), nullable=True),
        sa.Column("lease_s", sa.Double(), nullable=True),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("heartbeat_at", _TS, nullable=True),
        sa.Column("lease_until", _TS, nullable=True),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("generation >= 0", name="jobs_generation_nonneg_check"),
        sa.CheckConstraint("job <> ''", name="jobs_job_nonempty_check"),
        sa.CheckConstraint("lease_s IS NULL OR lease_s > 0", name="jobs_lease_positive_check"),
        sa.PrimaryKeyConstraint("job", name="jobs_pkey"),
        schema=schema,
    )
    op.create_table(
        "offsets",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("off", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("off >= 0", name="offsets_off_nonneg_check"),
        sa.CheckConstraint("part >= 0", name="offsets_part_nonneg_check"),
        sa.CheckConstraint("topic <> ''", name="offsets_topic_nonempty_check"),
        sa.ForeignKeyConstraint(["job"], [f"{schema}.jobs.job"], name="offsets_job_fkey"),
        sa.PrimaryKeyConstraint("job", "topic", "part", name="offsets_pkey"),
        schema=schema,
    )
    op.create_table(
        "offset_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("old_off", sa.BigInteger(), nullable=True),
        sa.Column("new_off", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=True),
        sa.Column("at", _TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "action IN ('seed', 'new_partition', 'reset', 'data_loss_skip', 'import')",
            name="offset_audit_action_known_check",
        ),
        sa.CheckConstraint("new_off >= 0", name="offset_audit_new_off_nonneg_check"),
        sa.PrimaryKeyConstraint("id", name="offset_audit_pkey"),
        schema=schema,
    )
    op.create_index("ix_offset_audit_job_at", "offset_audit", ["job", "at"], schema=schema)


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_offset_audit_job_at", table_name="offset_audit", schema=schema)
    op.drop_table("offset_audit", schema=schema)
    op.drop_table("offsets", schema=schema)
    op.drop_table("jobs", schema=schema)
