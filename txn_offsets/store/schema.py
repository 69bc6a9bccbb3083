"""The offset store's tables in SQLAlchemy Core: the one source for runtime SQL and for alembic.

The Postgres schema that holds the tables is configurable (default ``txn_offsets``), so the tables
are built per schema name by :func:`tables_for` (cached: one set of Table objects per name). The
alembic environment uses :func:`metadata_for` as ``target_metadata`` and ``alembic check`` compares
it with the migrations, so a change here without a migration is caught as drift.

Nine tables:

* ``offsets``: the next offset to read per (job, topic, partition), and the Kafka topic id it belongs
  to. It moves only by the guarded claim of a batch (``off = :from``), or by an audited action.
* ``jobs``: one row per job: the fencing ``generation`` (bumped by every new run and every reset)
  and the lease of the live run (``run_id``, ``heartbeat_at``, ``lease_until``).
* ``offset_audit``: every offset change that is not a normal batch commit (seed, reset, skip over
  lost data, import), with who, when, why and the old and new value.
* ``dead_letters``: records a decoder rejected, when the writer keeps them instead of failing the
  batch; written in the same transaction as the range's results and offset, so results plus dead
  letters always account for every record exactly once.
* ``job_stats``: per job, cumulative batch statistics for ``txn-offsets serve`` (a histogram of
  batch durations, outcome counters). Written by the runner in its own short transaction after a
  batch, never inside one; no foreign key, so writing it never locks a job row.
* ``stream_plans``: per job, the ranges of the batch a Structured Streaming query is running (the
  ``txn_offsets`` source writes it when it plans a batch; the exactly-once sink commits exactly
  those ranges with the batch's results and marks the row committed in that transaction). Tagged
  with the run's generation and the one stream reader that owns it.
* ``job_owners``: which database role owns a job (written by the admin, ``db grants --job``).
  Row-level security on the six tables above ties a job's rows to its owner
  (:mod:`txn_offsets.store.roles`, migration 0006); run roles get no grant on this table.
* ``commits``: the lineage, one row per range a guarded claim committed (from, until, the run's
  generation and id, the batch number and the first and last record timestamp when known),
  written in the claim's transaction (:mod:`txn_offsets.store.lineage`, migration 0008); pruned
  by age (``DatabaseSettings.lineage_retention_days``). Row-level security like the others.
* ``job_runs``: one row per run (generation, run id, host, start) and how it ended (finished, failed
  with its error's class and a one-line cause, fenced by a newer generation, its holder's process
  gone, its lease expired), written by the trigger ``record_run`` on ``jobs`` in the transaction
  that moves the job row, and by the runner for a failure (migration 0013). Row-level security
  like the others.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from txn_offsets.config import validate_identifier

__all__ = [
    "AUDIT_ACTIONS",
    "BATCH_SECONDS_BUCKETS",
    "DEFAULT_SCHEMA",
    "RUN_ENDS",
    "STAT_OUTCOMES",
    "Tables",
    "metadata_for",
    "run_role_grants",
    "tables_for",
]

DEFAULT_SCHEMA = "txn_offsets"

#: Why an offset moved outside a batch commit (a CHECK constraint keeps the column to these).
AUDIT_ACTIONS = (
    "seed",
    "new_partition",
    "new_topic",
    "reset",
    "data_loss_skip",
    "import",
    "retire",
    "lineage_prune",
)

# Explicit constraint names: migrations and downgrades refer to them, and autogenerate compares them.
NAMING_CONVENTION = {
    "pk": "%(table_name)s_pkey",
    "fk": "%(table_name)s_%(column_0_name)s_fkey",
    "ck": "%(table_name)s_%(constraint_name)s_check",
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
}

_TS = sa.DateTime(timezone=True)

# Kafka's legal topic names ([a-zA-Z0-9._-], 1-249 characters, not "." or ".."): a CHECK on every
# column holding one (migration 0011; since 0014 without a bounded repetition, which PostgreSQL's
# regex engine runs ~40 times slower on every row written; the migration's text, character for
# character).
_TOPIC_LEGAL = "topic ~ '^[a-zA-Z0-9._-]+$' AND length(topic) <= 249 AND topic NOT IN ('.', '..')"
# stream_plans.ranges: an array of [topic, partition, start, until(, topic id)], each topic legal
# (jsonpath has no length function: a topic of 250 characters or more matches "^.{250}")
_BAD_RANGE = (
    'strict $[*] ? (@.type() != "array" || @.size() == 0 || @[0].type() != "string"'
    ' || !(@[0] like_regex "^[a-zA-Z0-9._-]+$") || @[0] like_regex "^.{250}"'
    ' || @[0] == "." || @[0] == "..")'
)
_BAD_RANGES = f"jsonb_path_exists(ranges, '{_BAD_RANGE}', '{{}}', true)"  # silent: NULL on an error
_PLAN_TOPICS_LEGAL = f"jsonb_typeof(ranges) = 'array' AND NOT coalesce({_BAD_RANGES}, true)"

#: Upper bounds (seconds) of the batch duration histogram's buckets; ``job_stats.batch_buckets``
#: holds one count per bound plus one for +Inf. Changing them needs a migration that resets it.
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: How a run ended (``job_runs.ended``; NULL: not yet, or not known), migration 0013.
RUN_ENDS = ("finished", "failed", "fenced", "holder_gone", "lease_expired")

#: The counters of ``job_stats``: ranges committed / found already committed, and failures.
STAT_OUTCOMES = (
    "committed",
    "already_committed",
    "conflict",
    "fenced",
    "rejected",
    "data_loss",
    "mirror_failed",
)


@dataclass(frozen=True)
class Tables:
    """The tables of one schema."""

    metadata: sa.MetaData
    jobs: sa.Table
    offsets: sa.Table
    audit: sa.Table
    dead_letters: sa.Table
    stats: sa.Table
    stream_plans: sa.Table
    owners: sa.Table
    commits: sa.Table
    runs: sa.Table


@functools.cache
def tables_for(schema: str = DEFAULT_SCHEMA) -> Tables:
    """The tables in Postgres schema `schema` (validated: it is rendered as an identifier)."""
    validate_identifier(schema, "schema")
    md = sa.MetaData(schema=schema, naming_convention=NAMING_CONVENTION)
    jobs = sa.Table(
        "jobs",
        md,
        sa.Column("job", sa.Text, primary_key=True),
        # Bumped by every new run and by every admin reset; a claim must carry the current value.
        sa.Column("generation", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("run_id", sa.Text, nullable=True),
        sa.Column("run_host", sa.Text, nullable=True),
        # the lease holder's process (store.holders): a restart on its host may prove it dead
        sa.Column("run_process", sa.Text, nullable=True),
        sa.Column("lease_s", sa.Double, nullable=True),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("heartbeat_at", _TS, nullable=True),
        sa.Column("lease_until", _TS, nullable=True),
        # When the job planned for the first time: the start policy applies to the topics of that
        # plan only; a topic that appears later starts at its log start.
        sa.Column("first_plan_at", _TS, nullable=True),
        # Set by `txn-offsets jobs retire`; the job counts as retired until a run starts after it.
        sa.Column("retired_at", _TS, nullable=True),
        sa.Column("created_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("generation >= 0", name="generation_nonneg"),
        sa.CheckConstraint("job <> ''", name="job_nonempty"),
        sa.CheckConstraint("lease_s IS NULL OR lease_s > 0", name="lease_positive"),
    )
    offsets = sa.Table(
        "offsets",
        md,
        sa.Column("job", sa.Text, sa.ForeignKey(jobs.c.job), primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        # The next offset to read: the end of the last applied range.
        sa.Column("off", sa.BigInteger, nullable=False),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
        # The Kafka topic id the offset belongs to: a topic re-created under the same name has a
        # new id, and an offset of the old incarnation says nothing about the new log.
        sa.Column("topic_id", sa.Text, nullable=True),
        sa.CheckConstraint("off >= 0", name="off_nonneg"),
        sa.CheckConstraint("part >= 0", name="part_nonneg"),
        sa.CheckConstraint("topic <> ''", name="topic_nonempty"),
        sa.CheckConstraint(_TOPIC_LEGAL, name="topic_legal"),
    )
    audit = sa.Table(
        "offset_audit",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("old_off", sa.BigInteger, nullable=True),
        sa.Column("new_off", sa.BigInteger, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=True),
        sa.Column("at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(
            "action IN (" + ", ".join(f"'{a}'" for a in AUDIT_ACTIONS) + ")", name="action_known"
        ),
        sa.CheckConstraint("new_off >= 0", name="new_off_nonneg"),
        sa.CheckConstraint(_TOPIC_LEGAL, name="topic_legal"),
        sa.Index("ix_offset_audit_job_at", "job", "at"),
    )
    dead_letters = sa.Table(
        "dead_letters",
        md,
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
        sa.Column("off", sa.BigInteger, primary_key=True),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("value", sa.LargeBinary, nullable=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(_TOPIC_LEGAL, name="topic_legal"),
    )
    stats = sa.Table(
        "job_stats",
        md,
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("batches", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("batch_seconds_sum", sa.Double, nullable=False, server_default=sa.text("0")),
        # non-cumulative counts per bucket of BATCH_SECONDS_BUCKETS, the last one for +Inf
        sa.Column("batch_buckets", sa.ARRAY(sa.BigInteger), nullable=False),
        *[
            sa.Column(name, sa.BigInteger, nullable=False, server_default=sa.text("0"))
            for name in STAT_OUTCOMES
        ],
        sa.Column("last_batch_at", _TS, nullable=True),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("batches >= 0", name="batches_nonneg"),
    )
    stream_plans = sa.Table(
        "stream_plans",
        md,
        sa.Column("job", sa.Text, sa.ForeignKey(jobs.c.job), primary_key=True),
        sa.Column("generation", sa.BigInteger, nullable=False),
        # the stream reader (one query) that plans this generation's batches
        sa.Column("reader", sa.Text, nullable=False),
        # [[topic, partition, start, until], ...] in range order
        sa.Column("ranges", postgresql.JSONB, nullable=False),
        # set by the sink in the transaction that commits the ranges
        sa.Column("committed", sa.Boolean, nullable=False),
        sa.Column("planned_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(_PLAN_TOPICS_LEGAL, name="topics_legal"),
    )
    owners = sa.Table(
        "job_owners",
        md,
        # no foreign key: a job may get its owner before its first run creates the jobs row
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("granted_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("role <> ''", name="role_nonempty"),
        sa.Index("ix_job_owners_role", "role"),
    )
    commits = sa.Table(
        "commits",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("from_off", sa.BigInteger, nullable=False),
        sa.Column("until_off", sa.BigInteger, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        # the runner's batch number within the run (the stream sink: Spark's batch id); NULL: unknown
        sa.Column("batch", sa.BigInteger, nullable=True),
        # the range's first and last record timestamps (PartitionWriter); NULL: unknown or none
        sa.Column("first_record_at", _TS, nullable=True),
        sa.Column("last_record_at", _TS, nullable=True),
        sa.Column("committed_at", _TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("from_off >= 0 AND until_off >= from_off", name="range_valid"),
        sa.CheckConstraint(_TOPIC_LEGAL, name="topic_legal"),
        sa.Index("ix_commits_job_topic_part_until_off", "job", "topic", "part", "until_off"),
        sa.Index("ix_commits_job_committed_at", "job", "committed_at"),
    )
    runs = sa.Table(
        "job_runs",
        md,
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("generation", sa.BigInteger, primary_key=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=True),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("ended", sa.Text, nullable=True),
        # the generation (and its run, if a run took it) that came after a fenced or expired run
        sa.Column("ended_by_generation", sa.BigInteger, nullable=True),
        sa.Column("ended_by_run", sa.Text, nullable=True),
        # a failure's error class, and the first line of a txn_offsets error's message (no payload)
        sa.Column("error_class", sa.Text, nullable=True),
        sa.Column("cause", sa.Text, nullable=True),
        sa.CheckConstraint(
            "ended IS NULL OR ended IN (" + ", ".join(f"'{e}'" for e in RUN_ENDS) + ")", name="ended_known"
        ),
        sa.CheckConstraint("length(cause) <= 300", name="cause_short"),
    )
    return Tables(md, jobs, offsets, audit, dead_letters, stats, stream_plans, owners, commits, runs)


def metadata_for(schema: str = DEFAULT_SCHEMA) -> sa.MetaData:
    """The MetaData holding the tables of `schema` (alembic's ``target_metadata``)."""
    return tables_for(schema).metadata


def run_role_grants(schema: str, role: str) -> list[str]:
    """The GRANTs a job's run role needs: read and move rows, never DDL, DELETE only of old lineage.

    Row locks (``FOR UPDATE`` / ``FOR KEY SHARE``) need UPDATE; the audit table is append-only.
    The DELETEs are on ``commits``, the lineage: the planner prunes the job's old rows; and on
    ``job_runs``, whose trigger (run as the run role) keeps the newest 1,000 generations per job.
    Both names are validated identifiers, so quoting them is enough to make the SQL safe.
    """
    s = f'"{validate_identifier(schema, "schema")}"'
    r = f'"{validate_identifier(role, "role")}"'
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.jobs, {s}.offsets TO {r}",
        f"GRANT SELECT, INSERT ON {s}.offset_audit TO {r}",
        f"GRANT SELECT, INSERT ON {s}.dead_letters TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.job_stats TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.stream_plans TO {r}",
        f"GRANT SELECT, INSERT, DELETE ON {s}.commits TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.job_runs TO {r}",
        f"GRANT SELECT ON {s}.alembic_version TO {r}",
    ]
