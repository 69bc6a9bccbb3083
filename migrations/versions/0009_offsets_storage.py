"""offsets storage for its workload: fillfactor 70 (HOT updates), row-level security once per statement

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 16:00:00

Every batch UPDATEs one ``offsets`` row per partition (``off``, ``updated_at``). No index covers
either column (the only index is the primary key ``(job, topic, part)``), so each of those updates
can be HOT (heap-only: no index entry, the old version pruned from the page later) if the new
version fits on the row's page. At the default fillfactor (100) the pages are full when the rows
are seeded and most updates are not HOT: measured on the dev stack, 200 set-based updates of 4,096
rows: HOT ratio 0.06 and the heap 56-90 MB; at fillfactor 70: 0.78-0.92 and 10-31 MB (at 50: 0.67-
0.74 and 44-64 MB, the emptier pages cost more than the room saves). ``ALTER TABLE ... SET
(fillfactor)`` applies to pages written from now on; existing rows move as they are updated (or
at a ``VACUUM FULL`` an operator may run).

Row-level security (0006) evaluated ``job_reachable(job, current_user)`` once per ROW: a plan that
loads 4,096 offset rows called it 4,096 times (~200 ms on the dev stack), and a claim paid it
twice per row (USING and WITH CHECK). The policies now ask the same question as two uncorrelated
sub-selects that PostgreSQL evaluates once per statement (InitPlans): the role's scope (``all``:
the admin, or nobody owns any job; ``owned``: it owns jobs; ``unowned``: it owns none while others
do) and the array of the jobs it owns; only a role of the last kind still needs a per-row probe
(is this job owned?). The answer for every (job, role) is the one ``job_reachable`` gives, which
stays (``roles.require_reachable`` uses it).
"""

from __future__ import annotations

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

POLICY = "job_owner"
TABLES = ("jobs", "offsets", "offset_audit", "dead_letters", "job_stats", "stream_plans", "commits")
FILLFACTOR = 70

# {q} is the quoted schema (a validated identifier). SECURITY DEFINER as job_reachable: run roles
# have no grant on job_owners. search_path pinned, every name qualified.
_DEFINER = "STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp"
FUNCTIONS = """
CREATE FUNCTION {q}.job_scope(p_role text) RETURNS text
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = '{q}.jobs'::regclass
               AND (pg_has_role(p_role, c.relowner, 'USAGE')
                    OR pg_has_role(p_role, n.nspowner, 'USAGE'))) THEN
    RETURN 'all';
  END IF;
  IF EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.role = p_role) THEN
    RETURN 'owned';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {q}.job_owners) THEN
    RETURN 'all';
  END IF;
  RETURN 'unowned';
END
$fn$;
CREATE FUNCTION {q}.jobs_owned_by(p_role text) RETURNS text[]
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  RETURN coalesce((SELECT array_agg(o.job) FROM {q}.job_owners o WHERE o.role = p_role), '{}');
END
$fn$;
CREATE FUNCTION {q}.job_owned(p_job text) RETURNS boolean
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  RETURN EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.job = p_job);
END
$fn$
"""

CHECK = (
    "(SELECT {q}.job_scope(current_user)) = 'all'"
    " OR job = ANY ((SELECT {q}.jobs_owned_by(current_user))::text[])"
    " OR ((SELECT {q}.job_scope(current_user)) = 'unowned' AND NOT {q}.job_owned(job))"
)
OLD_CHECK = "{q}.job_reachable(job, current_user)"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return schema


def _policies(q: str, check: str) -> None:
    for table in TABLES:
        op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {q}.{table}")
        op.execute(f"CREATE POLICY {POLICY} ON {q}.{table} USING ({check}) WITH CHECK ({check})")


def upgrade() -> None:
    q = f'"{_schema()}"'
    op.execute(f"ALTER TABLE {q}.offsets SET (fillfactor = {FILLFACTOR})")
    for statement in FUNCTIONS.replace("{q}", q).replace("{definer}", _DEFINER).split("$fn$;"):
        op.execute(statement if statement.rstrip().endswith("$fn$") else statement + "$fn$")
    _policies(q, CHECK.replace("{q}", q))


def downgrade() -> None:
    q = f'"{_schema()}"'
    _policies(q, OLD_CHECK.replace("{q}", q))
    for fn in ("job_scope(text)", "jobs_owned_by(text)", "job_owned(text)"):
        op.execute(f"DROP FUNCTION IF EXISTS {q}.{fn}")
    op.execute(f"ALTER TABLE {q}.offsets RESET (fillfactor)")
