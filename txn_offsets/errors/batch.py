"""What a batch's ranges can come to besides success: the protocol's errors (conflicts, fencing,
data loss, a changed topic, a failed write or read). Each that a task reports instead of raising
has an ``outcome``; the transient ones are retried by ``run_job`` from the stored offsets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from txn_offsets.errors.base import Transient, TxnOffsetsError

# why a stored offset no longer points into the topic's log (see DataLoss)
DataLossKind = Literal["retention", "truncated", "recreated"]

__all__ = [
    "BatchFailed",
    "ClaimBlocked",
    "CommitNotApplied",
    "DataLoss",
    "DataLossKind",
    "FenceCause",
    "Fenced",
    "FencedBy",
    "KafkaReadError",
    "OffsetConflict",
    "OffsetsRolledBack",
    "RecordRejected",
    "RecordsNotConsumed",
    "RunCommitted",
    "StreamDiverged",
    "TopicChanged",
    "TransactionAborted",
    "WriteFailed",
]


class TopicChanged(Transient):
    """The topic a batch was planned from is not the topic there is now: it was deleted (and maybe
    created again under the same name) between the plan and the commit. Nothing was committed; the
    runner plans again from the stored offsets, and that plan reports the new topic as data loss
    (``on_data_loss``)."""

    outcome = "topic_changed"

    def __init__(
        self, topic: str, planned_id: str, current_id: str | None, *, in_store: bool = False
    ) -> None:
        self.topic = topic
        self.planned_id = planned_id
        self.current_id = current_id
        self.in_store = in_store  # True: the stored offset row changed incarnation, not (yet) Kafka
        if in_store:
            now = f"its stored offset row now belongs to topic id {current_id}"
        elif current_id is not None:
            now = f"Kafka now has topic id {current_id}"
        else:
            now = "the topic does not exist any more"
        super().__init__(
            f"topic {topic!r} changed while its records were processed: the batch was planned from "
            f"topic id {planned_id} and {now} (deleted and re-created?). Nothing of it was committed; "
            f"the next plan starts again from the stored offsets."
        )


class OffsetConflict(TxnOffsetsError):
    """The stored offset is neither the range's start nor its end: another writer moved it."""

    outcome = "conflict"

    def __init__(self, job: str, topic: str, partition: int, expected: int, found: int | None) -> None:
        self.job = job
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.found = found
        where = "no offset row" if found is None else f"offset {found}"
        super().__init__(
            f"offset conflict for job {job!r} {topic}[{partition}]: expected offset {expected}, "
            f"found {where}. Another run or a manual reset moved it; restart the job so it plans "
            f"from the stored offsets."
        )


class OffsetsMovedOn(OffsetConflict, Transient):
    """The stored offset is PAST the range's start at the run's own generation: a task of this run
    committed there after the range was planned - a task of a batch that failed or was cancelled
    (a batch timeout, a failed round) reaching its COMMIT before Spark stopped its worker, while the
    batch was planned again from the table. Only the run's own tasks write under its generation
    (resets, imports and new runs bump it), so that commit is exact; nothing of this range was
    committed, and planning again from the stored offsets goes on after it. An OffsetConflict (for
    code that handles those) that ``run_job`` retries."""

    def __init__(self, job: str, topic: str, partition: int, expected: int, found: int | None) -> None:
        TxnOffsetsError.__init__(
            self,
            f"the stored offset of job {job!r} {topic}[{partition}] is {found}, past the planned start "
            f"{expected}: a task of this run committed there after the batch was planned (a task of a "
            f"failed or cancelled batch?). Nothing of the range was committed; the next plan starts "
            f"from the stored offsets.",
        )
        self.job = job
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.found = found


class OffsetsRolledBack(Transient):
    """The stored offset is BEHIND the range's start at the run's own generation: the database lost
    its last commits under the running run (a failover to an asynchronous replica, a restore), the
    results with them. Resets bump the generation and refuse while a run is live, so nothing else
    moves an offset back. Nothing of the range was committed; planning again from the stored
    offsets reads the lost records from Kafka again."""

    outcome = "rolled_back"

    def __init__(self, job: str, topic: str, partition: int, expected: int, found: int) -> None:
        self.job = job
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.found = found
        super().__init__(
            f"the stored offset of job {job!r} {topic}[{partition}] went back from {expected} to {found} "
            f"under the running run: the database lost its last commits (a failover to an asynchronous "
            f"replica, a restore?). Nothing of the range was committed; the next plan starts again from "
            f"the stored offsets."
        )


#: what took a job from a fenced run: a newer run, or an audited offsets reset, import or retire
FenceCause = Literal["run", "reset", "import", "retire"]
_CAUSES = {
    "run": "a newer run",
    "reset": "an offsets reset",
    "import": "an offsets import",
    "retire": "jobs retire",
}
_SHOWN_PARTITIONS = 3  # partitions a fenced run's message names where its commits end


@dataclass(frozen=True)
class FencedBy:
    """What took the job from a fenced run, as the store recorded it: the start of a newer run
    (``who`` its run id, host:pid:id) or an audited reset, import or retire (``who`` the actor,
    user@host; ``reason`` the audit's)."""

    cause: FenceCause
    generation: int  # the generation it made: the fenced run's + 1
    who: str | None = None
    at: datetime | None = None
    reason: str | None = None
    host: str | None = None  # a newer run's host (its run id may be gone: the run ended)

    def describe(self) -> str:
        what = _CAUSES[self.cause]
        if self.cause == "run":
            run = f", run {self.who}" if self.who else (f", on host {self.host}" if self.host else "")
            when = f", started at {_when(self.at)}" if self.at else ""
            return f"{what} of this job (generation {self.generation}{run}{when})"
        who = f" by {self.who}" if self.who else ""
        when = f" at {_when(self.at)}" if self.at else ""
        why = f", reason {_short(self.reason)}" if self.reason else ""
        return f"{what} (generation {self.generation}){who}{when}{why}"


@dataclass(frozen=True)
class RunCommitted:
    """What a fenced run had committed before the fence: ``batches`` it completed (epochs, in the
    low-latency mode), ``ranges`` it committed in all (None: unknown, the lineage is off) of which
    ``in_flight`` belong to the batch it was running, and per partition the offset its commits
    reached (``through``: (topic, partition, offset), in partition order)."""

    run_id: str
    batches: int
    ranges: int | None = None
    in_flight: int = 0
    through: tuple[tuple[str, int, int], ...] = ()

    def describe(self) -> str:
        if self.batches == 0 and not self.ranges:
            return f"This run ({self.run_id}) had committed nothing before it."
        batches = f"{self.batches} batch{'es' if self.batches != 1 else ''}"
        if self.in_flight:
            batches += f" and {self.in_flight} range(s) of batch {self.batches + 1}, which was in flight"
        if self.ranges is None:
            counted = (
                " (ranges of the batch in flight that committed first are not counted: the lineage is off)"
            )
        else:
            counted = f" ({self.ranges} range(s){self._through()})"
        rest = f"the rest of batch {self.batches + 1} was not" if self.in_flight else "nothing after them was"
        return (
            f"Before it, this run ({self.run_id}) committed {batches}{counted}: those stay committed, "
            f"counted once; {rest} written."
        )

    def _through(self) -> str:
        if not self.through:
            return ""
        shown = ", ".join(f"{t}[{p}]@{o}" for t, p, o in self.through[:_SHOWN_PARTITIONS])
        more = len(self.through) - _SHOWN_PARTITIONS
        return f", through {shown}" + (f" and {more} more partition(s)" if more > 0 else "")


class Fenced(TxnOffsetsError):
    """The job's generation moved past this run's: a newer run started, or an offsets reset, an
    import or a jobs retire took the job. This run stops; what it committed stays committed.

    ``by`` (what fenced it) and ``committed`` (what this run had committed) are read from the store
    by the run's loop when the run stops (``store.fences``); None where they were not (a task's
    report, a store that did not answer)."""

    outcome = "fenced"

    def __init__(
        self,
        job: str,
        generation: int,
        current: int,
        *,
        by: FencedBy | None = None,
        committed: RunCommitted | None = None,
    ) -> None:
        self.job = job
        self.generation = generation
        self.current = current
        self.by = by
        self.committed = committed
        if by is None:
            what = (
                f"by generation {current} (a newer run, an offsets reset, an offsets import or jobs "
                f"retire: `txn-offsets offsets history --job {job!r}` and `txn-offsets jobs list` say which)"
            )
        else:
            now = f" (the job is at generation {current} now)" if current != by.generation else ""
            what = f"by {by.describe()}{now}"
        if committed is None:
            done = (
                "What this run committed before it stays committed (`txn-offsets offsets history` "
                "lists it); nothing after it was written."
            )
        else:
            done = committed.describe()
        super().__init__(
            f"run generation {generation} of job {job!r} was fenced {what}. {done} This run stops; "
            f"the next run starts from the stored offsets."
        )


def _when(at: datetime) -> str:
    return at.isoformat(sep=" ", timespec="seconds")


def _short(text: str, limit: int = 80) -> str:
    """An operator's free text in a one-line message: one line, at most `limit` characters, quoted."""
    line = " ".join(text.split())
    return repr(line if len(line) <= limit else line[: limit - 3] + "...")


class DataLoss(TxnOffsetsError):
    """Records the job has not processed are gone from Kafka, or the stored offset belongs to a log
    that no longer exists: deleted by retention (``retention``), the log truncated below the stored
    offset (``truncated``, e.g. unclean leader election), or the topic deleted and re-created under
    the same name (``recreated``: a new Kafka topic id)."""

    outcome = "data_loss"

    def __init__(
        self,
        job: str,
        topic: str,
        partition: int,
        stored: int,
        log_start: int,
        *,
        kind: DataLossKind = "retention",
        stored_topic_id: str | None = None,
        topic_id: str | None = None,
    ) -> None:
        self.job = job
        self.topic = topic
        self.partition = partition
        self.stored = stored
        self.log_start = log_start  # where an audited skip continues
        self.kind = kind
        self.stored_topic_id = stored_topic_id  # the incarnation the stored offset belongs to
        self.topic_id = topic_id  # the incarnation Kafka has now
        same_topic = stored_topic_id is not None and stored_topic_id == topic_id
        what = {
            "retention": (
                f"offsets [{stored}, {log_start}) were deleted from Kafka before they were processed"
            ),
            "truncated": (
                f"the stored offset {stored} is above the end of the log ({log_start}): the log was "
                + ("truncated" if same_topic else "truncated or the topic re-created")
                + f", and records written below {stored} would be skipped"
            ),
            "recreated": (
                f"the topic was deleted and re-created: the stored offset {stored} was committed for "
                f"Kafka topic id {stored_topic_id}, and the topic now has id {topic_id}, whose log "
                f"starts at {log_start}"
            ),
        }.get(kind, kind)
        super().__init__(
            f"data loss for job {job!r} {topic}[{partition}]: {what}. Use on_data_loss='skip' (audited) "
            f"to continue from {log_start}, or reset the offsets."
        )


class KafkaReadError(Transient):
    """Reading an offset range from Kafka failed or stalled."""

    def __init__(self, topic: str, partition: int, start: int, until: int, detail: str) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.until = until
        self.detail = detail
        super().__init__(f"reading {topic}[{partition}] offsets [{start}, {until}) failed: {detail}")


class BatchFailed(Transient):
    """A batch's Spark job failed (after Spark's own task retries); nothing of the failed ranges committed."""

    def __init__(self, job: str, batch: int, detail: str) -> None:
        self.job = job
        self.batch = batch
        self.detail = detail
        super().__init__(
            f"batch {batch} of job {job!r} failed: {detail}. Ranges that did not commit are planned "
            f"again when the job restarts."
        )


class RecordRejected(TxnOffsetsError):
    """The user's decoder rejected a record; the batch fails and nothing of it is written."""

    outcome = "rejected"

    def __init__(self, topic: str, partition: int, offset: int, detail: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.detail = detail
        super().__init__(
            f"record {topic}[{partition}]@{offset} was rejected by the decoder: {detail}. "
            f"Fix the decoder or enable the dead-letter table."
        )


class CommitNotApplied(Transient):
    """A batch's transaction did not commit and the stored offsets are unchanged: safe to retry."""

    def __init__(self, job: str, ranges: str, detail: str) -> None:
        self.job = job
        self.ranges = ranges
        self.detail = detail
        super().__init__(
            f"the commit of job {job!r} ranges {ranges} did not happen ({detail}); the stored offsets "
            f"were re-read and are unchanged, so nothing was written. Retry the batch."
        )


class TransactionAborted(TxnOffsetsError):
    """The user's write caught a database error: PostgreSQL aborted the transaction, so COMMIT would
    silently roll back. Nothing was committed and the offsets did not move."""

    outcome = "aborted"

    def __init__(self, job: str, ranges: str) -> None:
        self.job = job
        self.ranges = ranges
        super().__init__(
            f"the transaction of job {job!r} ranges {ranges} was aborted by a database error that the "
            f"write caught and did not re-raise; nothing was committed. Let database errors propagate "
            f"out of write, or wrap a statement that may fail in conn.begin_nested() (a savepoint)."
        )


class ClaimBlocked(Transient):
    """A claim waited longer than lock_timeout for an offset row another transaction holds (a frozen
    or slow executor); nothing was written. Retryable: the holder's session ends by its own timeouts."""

    outcome = "blocked"

    def __init__(self, job: str, ranges: str, timeout_s: float) -> None:
        self.job = job
        self.ranges = ranges
        self.timeout_s = timeout_s
        super().__init__(
            f"the claim of job {job!r} ranges {ranges} waited more than {timeout_s:g}s for a lock held by "
            f"another transaction; nothing was written and the batch is planned again. If it repeats, "
            f"look for a stuck session holding the offsets row (pg_stat_activity)."
        )


class RecordsNotConsumed(TxnOffsetsError):
    """The user's ``aggregate`` returned before reading every record of its range."""

    outcome = "not_consumed"

    def __init__(self, topic: str, partition: int, start: int, until: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.until = until
        super().__init__(
            f"aggregate returned before reading every record of {topic}[{partition}] offsets "
            f"[{start}, {until}); committing would skip the unread records, so nothing was committed. "
            f"aggregate must consume its input to the end (or return a lazy iterator over all of it)."
        )


class WriteFailed(TxnOffsetsError):
    """The user's write failed with a database error; nothing was committed. The message names the
    error class, SQLSTATE and table/constraint but never values (they may be record payloads)."""

    outcome = "write_failed"

    def __init__(self, job: str, ranges: str, error: str, sqlstate: str | None, where: str) -> None:
        self.job = job
        self.ranges = ranges
        self.error = error
        self.sqlstate = sqlstate
        self.where = where
        at = f" ({where})" if where else ""
        super().__init__(
            f"the write of job {job!r} ranges {ranges} failed: {error}, sqlstate {sqlstate or '?'}{at}; "
            f"nothing was committed. Values are not shown (they may be record payloads)."
        )


class StreamDiverged(TxnOffsetsError):
    """A Structured Streaming query and the offset table disagree: the query's batch was not
    committed by the exactly-once sink, or the offsets moved under the running query."""

    def __init__(self, job: str, generation: int, problem: str) -> None:
        self.job = job
        self.generation = generation
        self.problem = problem
        super().__init__(
            f"streaming query of job {job!r} (generation {generation}): {problem}. The offset table "
            f"is the truth: restart the stream (a new run plans from the table)."
        )
