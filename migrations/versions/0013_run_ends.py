"""how each run ended: the job_runs table, written by a trigger on jobs in the move's own transaction

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 10:00:00

``job_runs`` has one row per run of a job (its generation, run id, host and start), and how it ended:

* ``finished``: the run released its lease (``end_run``);
* ``failed``: the run stopped on an error; the runner records the error's class and, for
  txn_offsets' own errors (which never carry record payloads or secrets), the first line of its
  message (``store.run_ends.note_failure``), before it releases the lease;
* ``fenced``: a newer generation was taken while its lease was live: by a newer run
  (``ended_by_run``: forced, or ``holder_gone`` below) or by an admin move (a reset, an import, a
  retire: the audit rows of ``ended_by_generation`` say which, by whom and why);
* ``holder_gone``: a new run on the same host took the job over because the holder's process was
  provably gone (killed or crashed; ``store.holders``), recorded by that start;
* ``lease_expired``: its lease had run out (its driver stopped without ending it) when the next
  generation was taken.

A trigger on ``jobs`` (``record_run``, AFTER UPDATE, only when ``generation`` or ``run_id``
changes: a heartbeat never fires it) writes the rows in the transaction that starts, ends or fences
the run, whatever path moved the job row (a start, ``end_run``, a reset, an import, a retire). A
row's end is written once (``ended IS NULL``): a run noted failed and then released stays failed,
a fenced run that releases nothing stays fenced. The newest 1,000 generations of each job keep
their runs; older rows are deleted by the start that passes them (an index range of the primary
key). Row-level security and the run roles' grants as ``commits`` (0008): a run role writes the rows
of its own jobs through the trigger.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None

POLICY = "job_owner"  # the policy of migration 0006, on this table too
ENDS = ("finished", "failed", "fenced", "holder_gone", "lease_expired")
KEPT_GENERATIONS = 1000

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
    EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON {q}.job_runs TO ' || r;
  END LOOP;
END
$grant$
"""

RECORD_RUN = """
CREATE FUNCTION {q}.record_run() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF OLD.run_id IS NOT NULL THEN
    UPDATE {q}.job_runs r
    SET ended_at = now(),
        ended = CASE WHEN NEW.generation = OLD.generation THEN 'finished'
                     WHEN OLD.lease_until > now() THEN 'fenced'
                     ELSE 'lease_expired' END,
        ended_by_generation = CASE WHEN NEW.generation <> OLD.generation THEN NEW.generation END,
        ended_by_run = CASE WHEN NEW.generation <> OLD.generation THEN NEW.run_id END
    WHERE r.job = OLD.job AND r.generation = OLD.generation AND r.run_id = OLD.run_id
      AND r.ended IS NULL;
  END IF;
  IF NEW.run_id IS NOT NULL AND NEW.generation <> OLD.generation THEN
    INSERT INTO {q}.job_runs (job, generation, run_id, host, started_at)
    VALUES (NEW.job, NEW.generation, NEW.run_id, NEW.run_host, coalesce(NEW.started_at, now()))
    ON CONFLICT DO NOTHING;
    DELETE FROM {q}.job_runs r WHERE r.job = NEW.job AND r.generation <= NEW.generation - {kept};
  END IF;
  RETURN NULL;
END
$fn$
"""

TRIGGER = """
CREATE TRIGGER record_run AFTER UPDATE OF generation, run_id ON {q}.jobs FOR EACH ROW
WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.generation IS DISTINCT FROM NEW.generation)
EXECUTE FUNCTION {q}.record_run()
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
        "job_runs",
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=True),
        sa.Column("started_at", ts, nullable=False),
        sa.Column("ended_at", ts, nullable=True),
        sa.Column("ended", sa.Text, nullable=True),
        sa.Column("ended_by_generation", sa.BigInteger, nullable=True),
        sa.Column("ended_by_run", sa.Text, nullable=True),
        sa.Column("error_class", sa.Text, nullable=True),
        sa.Column("cause", sa.Text, nullable=True),
        sa.CheckConstraint(
            "ended IS NULL OR ended IN (" + ", ".join(f"'{e}'" for e in ENDS) + ")",
            name="ended_known",
        ),
        sa.CheckConstraint("length(cause) <= 300", name="cause_short"),
        sa.PrimaryKeyConstraint("job", "generation", name="job_runs_pkey"),
        schema=schema,
    )
    op.execute(f"ALTER TABLE {q}.job_runs ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {q}.job_runs FORCE ROW LEVEL SECURITY")
    check = f"{q}.job_reachable(job, current_user)"
    op.execute(f"CREATE POLICY {POLICY} ON {q}.job_runs USING ({check}) WITH CHECK ({check})")
    op.execute(GRANT_RUN_ROLES.replace("{q}", q))
    op.execute(RECORD_RUN.replace("{q}", q).replace("{kept}", str(KEPT_GENERATIONS)))
    op.execute(TRIGGER.replace("{q}", q))


def downgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'
    op.execute(f"DROP TRIGGER IF EXISTS record_run ON {q}.jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {q}.record_run()")
    op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {q}.job_runs")
    op.drop_table("job_runs", schema=schema)
