"""commit lineage: one row per committed range (commits), row-level security like every job table

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 14:00:00

``commits`` records every range a guarded claim committed: job, topic, partition, ``[from_off,
until_off)``, the run's generation and run id, the batch number when known, the first and last
record timestamp when known, and ``committed_at``. It is written by ``commit_ranges`` in the same
transaction as the claim, so a rolled-back attempt leaves no row and a committed range has exactly
one. The planner prunes rows older than ``DatabaseSettings.lineage_retention_days`` (bounded
DELETEs), so the run role gets DELETE on this table (row-level security keeps it to its jobs).
No foreign key to ``jobs``: a retired job's lineage outlives its offset rows until retention.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

POLICY = "job_owner"  # the policy of migration 0006, on this table too

# {q} is the quoted schema; role names are quoted by quote_ident (the grantees of UPDATE on
# offsets, PUBLIC and the owner left out)
GRANT_RUN_ROLES = """
DO $grant$
DECLARE r text;
BEGIN
  FOR r IN SELECT DISTINCT quote_ident(g.rolname)
           FROM pg_catalog.pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
           JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
           WHERE c.oid = '{q}.offsets'::regclass AND a.privilege_type = 'UPDATE'
             AND a.grantee <> c.relowner
  LOOP
    EXECUTE 'GRANT SELECT, INSERT, DELETE ON {q}.commits TO ' || r;
  END LOOP;
END
$grant$
"""


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'  # a validated identifier (DatabaseSettings), so quoting it is enough
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "commits",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("from_off", sa.BigInteger, nullable=False),
        sa.Column("until_off", sa.BigInteger, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("batch", sa.BigInteger, nullable=True),
        sa.Column("first_record_at", ts, nullable=True),
        sa.Column("last_record_at", ts, nullable=True),
        sa.Column("committed_at", ts, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("from_off >= 0 AND until_off >= from_off", name="commits_range_valid_check"),
        sa.PrimaryKeyConstraint("id", name="commits_pkey"),
        schema=schema,
    )
    op.create_index(
        "ix_commits_job_topic_part_until_off", "commits", ["job", "topic", "part", "until_off"], schema=schema
    )
    op.create_index("ix_commits_job_committed_at", "commits", ["job", "committed_at"], schema=schema)
    op.execute(f"ALTER TABLE {q}.commits ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {q}.commits FORCE ROW LEVEL SECURITY")
    check = f"{q}.job_reachable(job, current_user)"
    op.execute(f"CREATE POLICY {POLICY} ON {q}.commits USING ({check}) WITH CHECK ({check})")
    # every role that may move offsets (a run role granted before this revision) may now record
    # and prune lineage, or its next commit would fail on a missing grant
    op.execute(GRANT_RUN_ROLES.replace("{q}", q))


def downgrade() -> None:
    schema = _schema()
    op.execute(f'DROP POLICY IF EXISTS {POLICY} ON "{schema}".commits')
    op.drop_index("ix_commits_job_committed_at", table_name="commits", schema=schema)
    op.drop_index("ix_commits_job_topic_part_until_off", table_name="commits", schema=schema)
    op.drop_table("commits", schema=schema)
