"""What a plan moves before it reads: the offsets it settles in its transaction.

Before a batch's ranges can be planned from the stored offsets, each partition of the job's topics
needs a row at a position that is still in the log: a row is seeded for a partition without one
(the start policy for the topics of the job's first plan; the log start for a topic or partition
that appeared later), a row stored before topic ids were recorded adopts its topic's id, and a
position Kafka no longer has (retention, a topic deleted and created again) fails with DataLoss or,
with ``on_data_loss="skip"``, moves to where the log resumes - each move audited, each made under
the job row's lock by the run's generation or not at all (Fenced).

:func:`settle_offsets` does all of that in the planner's transaction (:mod:`txn_offsets.plan.planner`),
for each job with anything to move: the one job of ``plan_batch``; of the plans made together
(``run_jobs``), each job's first plan in a savepoint of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, DataLoss
from txn_offsets.kafka import recreated
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.data_loss import LOSS_REASONS, OnDataLoss, lost
from txn_offsets.ranges import TopicPartition
from txn_offsets.store import offset_rows

__all__ = ["settle_offsets", "unmoved"]

logger = logging.getLogger(__name__)


def settle_offsets(
    conn: sa.Connection,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    *,
    job: str,
    rows: Mapping[TopicPartition, offset_rows.StoredOffset],
    partitions: Sequence[TopicPartition],
    marks: Mapping[TopicPartition, tuple[int, int]],
    topic_ids: Mapping[str, str],
    first_plan: bool,
    start: StartPolicy | None,
    on_data_loss: OnDataLoss,
    timeout_s: float,
    generation: int | None,
) -> tuple[dict[TopicPartition, int], Mapping[TopicPartition, tuple[int, int]]]:
    """The stored offset of each of `partitions` once seeded, adopted and skipped as due (see the
    module), in `conn`'s transaction, and the (log start, end) of each to plan with: `marks`, or
    asked again and confirmed for a partition that would move (:func:`_confirmed`). `rows`: the
    job's offset rows, read in this transaction; `first_plan`: the job has never planned (the job
    row says)."""
    quick = unmoved(rows, partitions, marks, topic_ids, first_plan=first_plan)
    if quick is not None:
        return quick, marks
    missing = [tp for tp in partitions if tp not in rows]
    if missing:
        # a row is seeded at its log's start or end as Kafka answers them: confirmed first by the
        # log that holds the topic's id (a lagging leader answers ListOffsets from a deleted topic's
        # log: a seed at that log's start passes over the new topic's first records)
        marks = {**marks, **recreated.watermarks(kafka, missing, topic_ids, timeout_s=timeout_s)}
        _seed(
            conn,
            db=db,
            kafka=kafka,
            job=job,
            known_topics={topic for topic, _ in rows},
            first_plan=first_plan,
            missing=missing,
            start=start,
            marks=marks,
            topic_ids=topic_ids,
            timeout_s=timeout_s,
            generation=generation,
        )
        rows = offset_rows.load_rows(conn, db, job)  # another run may have seeded some: read back
    if first_plan:
        offset_rows.mark_first_plan(conn, db, job)
    legacy = {tp[0] for tp in partitions if rows[tp].topic_id is None}
    if legacy:
        offset_rows.adopt_topic_ids(conn, db, job, {t: topic_ids[t] for t in legacy})
    stored: dict[TopicPartition, int] = {}
    marks = _confirmed(kafka, rows, partitions, marks, topic_ids, timeout_s=timeout_s)
    for tp in partitions:
        loss = lost(rows[tp], topic_ids[tp[0]], marks[tp])
        stored[tp] = rows[tp].off
        if loss is None:
            continue
        kind, resume = loss
        if on_data_loss == "fail":
            raise DataLoss(
                job,
                tp[0],
                tp[1],
                rows[tp].off,
                resume,
                kind=kind,
                stored_topic_id=rows[tp].topic_id,
                topic_id=topic_ids[tp[0]],
            )
        offset_rows.skip_lost(
            conn,
            db,
            job,
            tp[0],
            tp[1],
            rows[tp].off,
            resume,
            reason=LOSS_REASONS[kind].format(
                stored=rows[tp].off, resume=resume, old_id=rows[tp].topic_id, new_id=topic_ids[tp[0]]
            ),
            generation=generation,  # a fenced run must not move offsets
            topic_id=topic_ids[tp[0]],
            to_new_log=kind != "retention",
        )
        logger.warning(
            "job %r %s[%d]: data loss (%s): moved from offset %d to %d",
            job,
            tp[0],
            tp[1],
            kind,
            rows[tp].off,
            resume,
        )
        stored[tp] = resume
    return stored, marks


def _confirmed(
    kafka: KafkaSettings,
    rows: Mapping[TopicPartition, offset_rows.StoredOffset],
    partitions: Sequence[TopicPartition],
    marks: Mapping[TopicPartition, tuple[int, int]],
    topic_ids: Mapping[str, str],
    *,
    timeout_s: float,
) -> Mapping[TopicPartition, tuple[int, int]]:
    """`marks`, but for each partition whose stored offset would move (a topic deleted and created
    again, retention, truncation: :func:`~txn_offsets.plan.data_loss.lost`) its (log start, end)
    asked again and confirmed by the log that holds its topic id now
    (:func:`txn_offsets.kafka.recreated.watermarks`). The first answer may be another log's: asked
    while the topic was described, the request answered before the topic went, or a leader that lags
    behind the metadata log answered from the old log it still holds under the name (the lab:
    tests/lab/test_lab_recreated_topic.py) - and a skip to that log's start passes over records of
    the new one, a truncation to its end goes back over records already counted. A lagging broker
    also describes the topic with its old id: a "re-creation" back to it is refused there too."""
    moving = [tp for tp in partitions if (row := rows.get(tp)) and lost(row, topic_ids[tp[0]], marks[tp])]
    if not moving:
        return marks
    return {**marks, **recreated.watermarks(kafka, moving, topic_ids, timeout_s=timeout_s)}


def unmoved(
    rows: Mapping[TopicPartition, offset_rows.StoredOffset],
    partitions: Sequence[TopicPartition],
    marks: Mapping[TopicPartition, tuple[int, int]],
    topic_ids: Mapping[str, str],
    *,
    first_plan: bool,
) -> dict[TopicPartition, int] | None:
    """The stored offset of each of `partitions` when :func:`settle_offsets` has nothing to move
    (not the job's first plan, every partition with a row of its topic's id, every offset in the
    log); None when it has (pure: the plan's fast path asks it before opening a transaction)."""
    if first_plan:
        return None
    stored: dict[TopicPartition, int] = {}
    for tp in partitions:
        row = rows.get(tp)
        if row is None or row.topic_id is None or lost(row, topic_ids[tp[0]], marks[tp]) is not None:
            return None
        stored[tp] = row.off
    return stored


def _seed(
    conn: sa.Connection,
    *,
    db: DatabaseSettings,
    kafka: KafkaSettings,
    job: str,
    known_topics: set[str],
    first_plan: bool,
    missing: Sequence[TopicPartition],
    start: StartPolicy | None,
    marks: Mapping[TopicPartition, tuple[int, int]],
    topic_ids: Mapping[str, str],
    timeout_s: float,
    generation: int | None,
) -> None:
    """Rows for partitions without one. The start policy is for the topics of the job's FIRST plan;
    a topic that appears later (a topic_pattern match, a topic added to the list) starts at its log
    start like a partition added to a known topic: every record of it is new to the job."""
    first = [tp for tp in missing if tp[0] not in known_topics and first_plan]
    new_topic = [tp for tp in missing if tp[0] not in known_topics and not first_plan]
    added = [tp for tp in missing if tp[0] in known_topics]
    if first:
        if start is None:
            names = sorted({t for t, _ in first})
            raise ConfigError(
                "start",
                f"job {job!r} has no stored offsets for {', '.join(names)}: choose where a first run starts "
                f"with start=StartPolicy.earliest() | .latest() | .at_timestamp(ms) | .explicit({{...}})",
            )
        _seed_rows(
            conn,
            db,
            job,
            start.resolve(kafka, first, marks, timeout_s=timeout_s),
            action="seed",
            reason=f"first run, start policy {start.kind}",
            topic_ids=topic_ids,
            generation=generation,
        )
    for group, action, reason in (
        (new_topic, "new_topic", "topic appeared after the job's first plan; starts at the log start"),
        (added, "new_partition", "partition added to a topic the job reads; starts at the log start"),
    ):
        if group:
            _seed_rows(
                conn,
                db,
                job,
                {tp: marks[tp][0] for tp in group},
                action=action,
                reason=reason,
                topic_ids=topic_ids,
                generation=generation,
            )


def _seed_rows(
    conn: sa.Connection,
    db: DatabaseSettings,
    job: str,
    offsets: Mapping[TopicPartition, int],
    *,
    action: str,
    reason: str,
    topic_ids: Mapping[str, str],
    generation: int | None,
) -> None:
    inserted = offset_rows.seed_offsets(
        conn,
        db,
        job,
        offsets,
        action=action,
        reason=reason,
        actor="planner",
        topic_ids=topic_ids,
        generation=generation,
    )
    if inserted:
        logger.info("job %r: %s for %d partition(s): %s", job, action, len(inserted), reason)
