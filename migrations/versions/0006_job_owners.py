"""job_owners and row-level security: a job's rows belong to the role that owns the job

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00

``job_owners (job, role)`` is written by the admin (``txn-offsets db grants --job J --role R``).
Every table with a ``job`` column gets ENABLE + FORCE ROW LEVEL SECURITY and one policy: a row is
reachable when ``job_reachable(job, current_user)`` holds, that is when

* current_user is (a member of) the owner of the tables or of the schema: the admin; or
* current_user owns the job; or
* nobody owns the job and current_user owns no job: a role granted the old, shared way (so a
  deployment upgraded to this revision runs exactly as before until jobs get owners).

Superusers and BYPASSRLS roles bypass row-level security anyway. FORCE makes the policy apply to
the table owner too (the first clause then lets it through, explicitly). ``job_reachable`` is
SECURITY DEFINER so that run roles need no grant on ``job_owners``: they can neither read who owns
what nor give themselves a job. current_user is what PostgreSQL authenticated (or SET ROLE), not a
setting the client chooses, and PgBouncer keeps it: a pooled server connection is per user.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

#: Every table whose rows belong to a job.
JOB_TABLES = ("jobs", "offsets", "offset_audit", "dead_letters", "job_stats", "stream_plans")
POLICY = "job_owner"

# p_role is the role asking (the policy passes current_user: inside a SECURITY DEFINER function
# current_user is the definer). Every name is qualified; search_path is pinned. PL/pgSQL, not SQL:
# its plans are cached for the session (a SQL function with SET is planned again on every call).
# {q} is the quoted schema (a validated identifier).
REACHABLE = """
CREATE FUNCTION {q}.job_reachable(p_job text, p_role text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = '{q}.jobs'::regclass
               AND (pg_has_role(p_role, c.relowner, 'USAGE')
                    OR pg_has_role(p_role, n.nspowner, 'USAGE'))) THEN
    RETURN true;
  END IF;
  RETURN EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.job = p_job AND o.role = p_role)
      OR (NOT EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.job = p_job)
          AND NOT EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.role = p_role));
END
$fn$
"""


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def upgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'  # a validated identifier (DatabaseSettings), so quoting it is enough
    op.create_table(
        "job_owners",
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("role <> ''", name="job_owners_role_nonempty_check"),
        sa.PrimaryKeyConstraint("job", name="job_owners_pkey"),
        schema=schema,
    )
    op.create_index("ix_job_owners_role", "job_owners", ["role"], schema=schema)
    op.execute(REACHABLE.replace("{q}", q))
    for table in JOB_TABLES:
        op.execute(f"ALTER TABLE {q}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {q}.{table} FORCE ROW LEVEL SECURITY")
        check = f"{q}.job_reachable(job, current_user)"
        op.execute(f"CREATE POLICY {POLICY} ON {q}.{table} USING ({check}) WITH CHECK ({check})")


def downgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'
    for table in JOB_TABLES:
        op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {q}.{table}")
        op.execute(f"ALTER TABLE {q}.{table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {q}.{table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"DROP FUNCTION IF EXISTS {q}.job_reachable(text, text)")
    op.drop_index("ix_job_owners_role", table_name="job_owners", schema=schema)
    op.drop_table("job_owners", schema=schema)
