"""tenant isolation: the row-level security helpers answer only for the session's own roles;
topic names are Kafka-legal by constraint

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 10:00:00

**The helpers.** ``job_reachable(job, role)`` (0006), ``job_scope(role)``, ``jobs_owned_by(role)``
and ``job_owned(job)`` (0009) are SECURITY DEFINER: they read ``job_owners``, which run roles may
not read. Until now they answered about any role they were given, to anyone: a run role could run
``SELECT rolname, jobs_owned_by(rolname) FROM pg_roles`` and read every owner and every job. They
now answer only

* about a role the session may act as: ``pg_has_role(session_user, role, 'MEMBER')`` (itself, or
  a role it may SET ROLE to), and only when the session or that role may read the store's ``jobs``
  table (a role of the store: the run grants, or the owner); or
* to the store's admin: a session that is (a member of) the owner of the tables or of the schema
  (it reads ``job_owners`` anyway), or a superuser.

``job_owned(job)`` - whether a job has an owner; the policy's per-row probe for a role that owns
no job - answers only to a role of the store that owns no job (a role granted the shared way, which
can tell an owned job name from a free one anyway: inserting the job's row is a policy violation
only when it is owned) and to the admin. Anyone else gets SQLSTATE 42501 (insufficient_privilege),
never an answer. The policies (0009) are unchanged: they pass ``current_user``, which the session
may always act as.

The boundary is ``session_user``: inside a SECURITY DEFINER function ``current_user`` is the
definer, and ``session_user`` is the role PostgreSQL authenticated (PgBouncer keeps a server
connection per user). So a query of a job table run inside some other role's SECURITY DEFINER
function, by a session that may not act as that role, is now refused instead of being answered for
the definer; txn_offsets has no such function.

EXECUTE stays granted to PUBLIC (PostgreSQL's default): every function in a policy expression is
executed with the privileges of the role running the query, and run roles are granted only what
``run_role_grants`` lists (tables and the schema), so a REVOKE would break every existing run role.
Calling a function needs USAGE on its schema, which only the store's roles have, and the checks
above refuse everyone else inside the function.

**Topic names.** ``offsets.topic`` took any non-empty text; one row with topic ``no'such topic``
made ``serve``'s Kafka metadata request fail for every job. Every column holding a topic name now
has a validated CHECK: ``offsets``, ``offset_audit``, ``dead_letters`` and ``commits`` (``topic``:
``[a-zA-Z0-9._-]{1,249}``, not ``.`` or ``..``, Kafka's rule), and ``stream_plans`` (the first
element of each of its ``ranges``, a JSON string). Existing rows that break the rule refuse the
upgrade (nothing changes): the error names up to five per table (job and topic, escaped and
shortened), and the admin deletes them (they name no Kafka topic) and upgrades again. The tables
are locked (ACCESS EXCLUSIVE, as ADD CONSTRAINT locks them anyway) before they are looked at, so
no row can slip in between the look and the constraint.

Downgrade restores the helpers of 0006/0009 as they were and drops the constraints.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from txn_offsets.errors import MigrationError

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None

#: Kafka's legal topic names (a POSIX regular expression; ``$`` is the end of the text only).
TOPIC_RE = "^[a-zA-Z0-9._-]{1,249}$"
#: The columns holding one topic name, and the constraint each gets (schema.py's naming convention).
TOPIC_COLUMNS = ("offsets", "offset_audit", "dead_letters", "commits")
TOPIC_CHECK = f"topic ~ '{TOPIC_RE}' AND topic NOT IN ('.', '..')"
#: stream_plans.ranges is [[topic, partition, start, until(, topic id)], ...]: an array of ranges,
#: each an array whose first element is a legal topic name (a JSON string). Strict mode: lax mode
#: would unwrap ["t"] to "t". Errors (a range that is no array) count as a bad range (silent: NULL).
BAD_RANGE = (
    'strict $[*] ? (@.type() != "array" || @.size() == 0 || @[0].type() != "string"'
    ' || !(@[0] like_regex "' + TOPIC_RE + '") || @[0] == "." || @[0] == "..")'
)
_BAD_RANGES = f"jsonb_path_exists(ranges, '{BAD_RANGE}', '{{}}', true)"  # silent: NULL on an error
PLANS_CHECK = f"jsonb_typeof(ranges) = 'array' AND NOT coalesce({_BAD_RANGES}, true)"
PLANS_LEGAL = "stream_plans_topics_legal_check"
_SHOWN = 5  # illegal rows named per table when the upgrade is refused

_DEFINER = "STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp"

# {q} is the quoted schema (a validated identifier). {who} is the role whose admin rights are asked.
_ADMIN = (
    "EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = '{q}.jobs'::regclass"
    " AND (pg_has_role({who}, c.relowner, 'USAGE') OR pg_has_role({who}, n.nspowner, 'USAGE')))"
)
# May this session ask about p_role? It may act as p_role, and one of them is a role of the store;
# else only if it is the store's admin (_ADMIN, asked second: a query, while this is a simple
# expression PL/pgSQL evaluates without the executor). NULL (an unknown answer) counts as no.
_MAY_ASK = (
    "coalesce(pg_has_role(session_user, p_role, 'MEMBER')"
    " AND (has_table_privilege(session_user, '{q}.jobs', 'SELECT')"
    " OR has_table_privilege(p_role, '{q}.jobs', 'SELECT')), false)"
)
_REFUSE = (
    "RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',"
    " MESSAGE = 'permission denied: {fn} answers only about roles this session may act as',"
    " HINT = 'pass current_user';"
)
_GUARD = """IF NOT {may_ask} THEN
    IF NOT {admin} THEN
      {refuse}
    END IF;
  END IF;"""
# job_owned: may the session probe job names? It is a role of the store owning no job (found in
# the same query as the answer: the shared run role pays this per row), or the store's admin.
_PROBE = (
    "SELECT has_table_privilege(session_user, '{q}.jobs', 'SELECT')"
    "\n           AND NOT EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.role = session_user::text),"
    "\n         EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.job = p_job)"
    "\n    INTO v_may, v_owned;"
)
_PROBE_REFUSE = (
    "RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',"
    " MESSAGE = 'permission denied: job_owned answers only to a role of the store that owns no job, "
    "and to its owner';"
)

# The bodies after the check are those of 0006 (job_reachable) and 0009 (the other three).
FUNCTIONS = {
    "job_reachable(text, text)": """
CREATE OR REPLACE FUNCTION {q}.job_reachable(p_job text, p_role text) RETURNS boolean
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  {guard}
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
$fn$""",
    "job_scope(text)": """
CREATE OR REPLACE FUNCTION {q}.job_scope(p_role text) RETURNS text
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  {guard}
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
$fn$""",
    "jobs_owned_by(text)": """
CREATE OR REPLACE FUNCTION {q}.jobs_owned_by(p_role text) RETURNS text[]
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  {guard}
  RETURN coalesce((SELECT array_agg(o.job) FROM {q}.job_owners o WHERE o.role = p_role), '{}');
END
$fn$""",
    "job_owned(text)": """
CREATE OR REPLACE FUNCTION {q}.job_owned(p_job text) RETURNS boolean
LANGUAGE plpgsql {definer} AS $fn$
DECLARE
  v_may boolean;
  v_owned boolean;
BEGIN
  {probe}
  IF NOT coalesce(v_may, false) THEN
    IF NOT {admin} THEN
      {probe_refuse}
    END IF;
  END IF;
  RETURN v_owned;
END
$fn$""",
}

# The definitions this revision replaces, exactly as 0006 and 0009 created them (downgrade).
OLD_FUNCTIONS = {
    "job_reachable(text, text)": """
CREATE OR REPLACE FUNCTION {q}.job_reachable(p_job text, p_role text) RETURNS boolean
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
""",
    "job_scope(text)": """
CREATE OR REPLACE FUNCTION {q}.job_scope(p_role text) RETURNS text
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
$fn$""",
    "jobs_owned_by(text)": """
CREATE OR REPLACE FUNCTION {q}.jobs_owned_by(p_role text) RETURNS text[]
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  RETURN coalesce((SELECT array_agg(o.job) FROM {q}.job_owners o WHERE o.role = p_role), '{}');
END
$fn$""",
    "job_owned(text)": """
CREATE OR REPLACE FUNCTION {q}.job_owned(p_job text) RETURNS boolean
LANGUAGE plpgsql {definer} AS $fn$
BEGIN
  RETURN EXISTS (SELECT 1 FROM {q}.job_owners o WHERE o.job = p_job);
END
$fn$
""",
}


def _topic_legal(table: str) -> str:
    """The name of `table`'s topic constraint (schema.py's convention: <table>_topic_legal_check)."""
    return f"{table}_topic_legal_check"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:  # pragma: no cover - env.py always sets it
        raise RuntimeError("migrations/env.py must set version_table_schema")
    return str(schema)


def function_sql(template: str, q: str) -> str:
    """A definition with its placeholders filled: `q` the quoted schema (a validated identifier),
    the name of the function in its refusal, and the fixed texts above."""
    name = template.split("{q}.", 1)[1].split("(", 1)[0]
    return (
        template.replace("{guard}", _GUARD)
        .replace("{may_ask}", _MAY_ASK)
        .replace("{refuse}", _REFUSE.replace("{fn}", name))
        .replace("{probe}", _PROBE)
        .replace("{probe_refuse}", _PROBE_REFUSE)
        .replace("{admin}", _ADMIN.replace("{who}", "session_user"))
        .replace("{definer}", _DEFINER)
        .replace("{q}", q)
    )


def _shown(value: str, length: int) -> str:
    """A tenant's text in an error line: escaped (repr: no control characters) and shortened."""
    return repr(value) if length <= len(value) else repr(value) + f"... ({length} characters)"


def illegal_topics(conn: sa.Connection, q: str) -> list[str]:
    """``table job 'j' topic 't'`` for up to _SHOWN rows per table whose topic is not Kafka-legal
    (``stream_plans job 'j' range '[...]'``: the first bad range, as JSON). `q`: the quoted schema;
    every other part of the SQL is a constant of this module."""
    found: list[str] = []
    for table in TOPIC_COLUMNS:
        rows = conn.execute(
            sa.text(
                "SELECT left(job, 80) AS job, length(job) AS j, left(topic, 80) AS topic,"  # noqa: S608
                f" length(topic) AS n FROM {q}.{table} WHERE NOT coalesce({TOPIC_CHECK}, true)"
                f" ORDER BY job, topic LIMIT {_SHOWN}"
            )
        ).all()
        found += [f"{table} job {_shown(r.job, r.j)} topic {_shown(r.topic, r.n)}" for r in rows]
    plans = conn.execute(
        sa.text(
            "SELECT left(job, 80) AS job, length(job) AS j, left(bad, 80) AS bad, length(bad) AS n"  # noqa: S608
            " FROM (SELECT job, coalesce("
            f"jsonb_path_query_first(ranges, '{BAD_RANGE}', '{{}}', true), ranges)::text AS bad"
            f" FROM {q}.stream_plans WHERE NOT coalesce({PLANS_CHECK}, true)) plans"
            f" ORDER BY job LIMIT {_SHOWN}"
        )
    ).all()
    found += [f"stream_plans job {_shown(r.job, r.j)} range {_shown(r.bad, r.n)}" for r in plans]
    return found


def upgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'  # a validated identifier (DatabaseSettings), so quoting it is enough
    for template in FUNCTIONS.values():
        op.execute(function_sql(template, q))
    tables = ", ".join(f"{q}.{t}" for t in (*TOPIC_COLUMNS, "stream_plans"))
    op.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
    bad = illegal_topics(op.get_bind(), q)
    if bad:
        raise MigrationError(
            "upgrade",
            schema,
            f"revision 0011 makes topic names Kafka-legal ([a-zA-Z0-9._-], 1-249 characters, not . "
            f"or ..) and these rows break it: {'; '.join(bad)}. No Kafka topic has such a name: "
            f"delete those rows (as the schema owner) and run `txn-offsets db upgrade` again "
            f"(nothing was changed)",
        )
    for table in TOPIC_COLUMNS:
        op.create_check_constraint(op.f(_topic_legal(table)), table, TOPIC_CHECK, schema=schema)
    op.create_check_constraint(op.f(PLANS_LEGAL), "stream_plans", PLANS_CHECK, schema=schema)


def downgrade() -> None:
    schema = _schema()
    q = f'"{schema}"'
    op.drop_constraint(op.f(PLANS_LEGAL), "stream_plans", type_="check", schema=schema)
    for table in reversed(TOPIC_COLUMNS):
        op.drop_constraint(op.f(_topic_legal(table)), table, type_="check", schema=schema)
    for template in OLD_FUNCTIONS.values():
        op.execute(template.replace("{definer}", _DEFINER).replace("{q}", q))
