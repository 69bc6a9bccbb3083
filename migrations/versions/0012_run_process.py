"""the lease holder's process: jobs.run_process

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 10:00:00

A run's start records which process holds the lease (``jobs.run_process``: the kernel's boot id,
the pid namespace, the pid and the process's start time in clock ticks since boot, as
``store.holders`` reads them on Linux; NULL elsewhere). A new run of the job on the same host
(``jobs.run_host`` and the same boot and pid namespace) whose holder is provably gone - no such
pid, the pid now another process (another start time), or a zombie - takes the job over at once
instead of waiting for the lease to expire. The takeover is a start like any other: it bumps the
generation, so anything the dead run left running is fenced. Another host's holder is never
judged by its pid.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return str(schema)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("run_process", sa.Text(), nullable=True), schema=_schema())


def downgrade() -> None:
    op.drop_column("jobs", "run_process", schema=_schema())
