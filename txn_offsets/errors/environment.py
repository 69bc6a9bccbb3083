"""Errors of configuration and of the services around a run: the stack, PostgreSQL, the schema,
the job's row. Transient ones (a service unreachable, a topic missing once a run has started) are
retried by ``run_job``; the rest say what to fix before anything runs."""

from __future__ import annotations

from txn_offsets.errors.base import ConfigError, Transient, TxnOffsetsError

__all__ = [
    "JavaNotFound",
    "JobAlreadyRunning",
    "MigrationError",
    "SchemaMissing",
    "ServiceUnavailable",
    "StackError",
    "TopicMissing",
    "UnknownJob",
]


class TopicMissing(ConfigError, Transient):
    """Kafka says a topic the job reads does not exist (never created, or deleted)."""

    def __init__(self, topic: str, problem: str) -> None:
        self.topic = topic
        super().__init__("topics", problem)


class StackError(TxnOffsetsError):
    """The embedded local stack (PostgreSQL, Kafka) could not be started, checked or stopped."""

    def __init__(self, service: str, problem: str, fix: str) -> None:
        self.service = service
        self.problem = problem
        self.fix = fix
        super().__init__(f"{service}: {problem}. Fix: {fix}")


class JavaNotFound(TxnOffsetsError):
    """No usable Java runtime (>= 17) for Spark or the local Kafka broker."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"{problem}; Spark 4 and Kafka 4 need Java >= 17. Fix: install one "
            f"(Debian: `apt-get install openjdk-17-jre-headless`) and/or set JAVA_HOME to it"
        )


class ServiceUnavailable(Transient):
    """PostgreSQL or Kafka could not be reached."""

    def __init__(self, service: str, target: str, detail: str) -> None:
        self.service = service
        self.target = target
        self.detail = detail
        super().__init__(
            f"cannot reach {service} at {target}: {detail}. "
            f"Check that it is running and that host, port and credentials are right."
        )


class SchemaMissing(TxnOffsetsError):
    """The offsets schema or a table is missing: migrations have not been run."""

    def __init__(self, schema: str, detail: str) -> None:
        self.schema = schema
        self.detail = detail
        super().__init__(
            f"the txn_offsets tables in schema {schema!r} are missing or out of date ({detail}). "
            f"Run `txn-offsets db upgrade` with a role that may create them."
        )


class MigrationError(TxnOffsetsError):
    """A schema migration command failed, or the tables differ from what the code expects."""

    def __init__(self, action: str, schema: str, detail: str) -> None:
        self.action = action
        self.schema = schema
        self.detail = detail
        super().__init__(f"`txn-offsets db {action}` on schema {schema!r}: {detail}")


class UnknownJob(TxnOffsetsError):
    """An operation names a job that has no row in the jobs table."""

    def __init__(self, job: str) -> None:
        self.job = job
        super().__init__(f"unknown job {job!r}: no run of it was ever started (see `txn-offsets jobs list`)")


class JobAlreadyRunning(TxnOffsetsError):
    """A live run holds the job's lease."""

    def __init__(
        self,
        job: str,
        run_id: str,
        generation: int,
        heartbeat_age_s: float,
        *,
        lease_left_s: float | None = None,
        lease_s: float | None = None,
        holder: str = "",
    ) -> None:
        self.job = job
        self.run_id = run_id
        self.generation = generation
        self.heartbeat_age_s = heartbeat_age_s
        self.lease_left_s = lease_left_s  # until the lease expires unless renewed (None: unknown)
        self.lease_s = lease_s  # the holder's lease length (run_job's lease_s)
        self.holder = (
            holder  # what this host knows of the holder, e.g. "its process 4121 is running on this host"
        )
        expires = ""
        if lease_left_s is not None:
            length = f"lease_s={lease_s:g}, " if lease_s is not None else ""
            expires = (
                f"; its lease expires in {max(lease_left_s, 0.0):.1f}s unless renewed "
                f"({length}set by run_job's lease_s)"
            )
        seen = f"; {holder}" if holder else ""
        super().__init__(
            f"job {job!r} is held by live run {run_id} (generation {generation}, last heartbeat "
            f"{heartbeat_age_s:.1f}s ago{expires}{seen}). Stop that run (SIGTERM ends it between "
            f"batches and frees the lease), wait for the lease to expire, or pass force=True / "
            f"--force to fence it now."
        )
