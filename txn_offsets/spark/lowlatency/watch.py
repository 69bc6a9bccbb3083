"""One epoch's Spark job, and the driver's watch over it while it runs.

The long-running tasks run as one Spark job on a thread of their own (in their own job group,
cancelled if they run past the epoch's bound by more than a grace period); the driver's thread
renews the run's lease, mirrors the table's offsets to the consumer group and looks for new
partitions, and ends the epoch early (:func:`~txn_offsets.spark.lowlatency.control.end_epoch`) on
stop or on a new partition.

A fence the driver sees (its lease renewal, or the mirror's generation check) is the run's end: it
is raised once the epoch's Spark job has returned, before anything of the epoch is published. A
task that stopped before its next check (at its deadline, caught up) reports no error, so the
tasks' reports alone cannot be trusted to carry it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import BatchFailed, Fenced, TxnOffsetsError
from txn_offsets.kafka import metadata
from txn_offsets.kafka.mirror import GroupMirror
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.ranges import TopicPartition
from txn_offsets.spark import frames
from txn_offsets.spark.batch import batch_deadline, spark_error_summary
from txn_offsets.spark.lowlatency.control import end_epoch
from txn_offsets.spark.lowlatency.follow import FollowReport, FollowTask
from txn_offsets.store import offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run, heartbeat, lock_job

__all__ = ["mirror_offsets", "run_epoch_job"]

logger = logging.getLogger(__name__)

_GRACE_S = 30.0  # past the epoch's bound before its Spark job is cancelled (at least epoch_s / 2)


def run_epoch_job(
    spark: Any,
    task: FollowTask,
    groups: tuple[tuple[int, ...], ...],
    *,
    store: Store,
    selection: TopicSelection,
    lease_s: float,
    mirror: GroupMirror | None,
    stop: threading.Event,
) -> list[FollowReport]:
    """Run the epoch `task` (its ``run``, ``epoch`` number and ``partitions``), one Spark task per
    group, as a Spark job on a thread of its own; this thread renews the run's lease, mirrors the
    table's offsets (`mirror`) and watches the topics of `selection`. Raises Fenced, once the Spark
    job has returned, if this thread saw the run fenced."""
    run, options, number = task.run, task.options, task.epoch
    known = set(task.partitions)
    out: list[FollowReport] = []
    failure: list[BaseException] = []
    fenced: Fenced | None = None
    expired = threading.Event()

    def body() -> None:
        sc = spark.sparkContext
        group = f"txn-offsets-{run.run_id}-epoch-{number}"
        bound = options.epoch_s + max(_GRACE_S, options.epoch_s / 2)
        try:
            with batch_deadline(spark, group, bound) as fired:
                try:
                    with frames.worker_imports():
                        out.extend(sc.parallelize(groups, len(groups)).mapPartitionsWithIndex(task).collect())
                finally:
                    if fired.is_set():
                        expired.set()
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=body, name=f"epoch-{run.job[:20]}-{number}", daemon=True)
    worker.start()
    every = min(1.0, lease_s / 3)
    ended = False
    next_beat = next_mirror = time.monotonic()
    while worker.is_alive():
        worker.join(timeout=0.05)
        now = time.monotonic()
        if not ended and stop.is_set():
            ended = _end(store, run, "stop requested")
        if ended or now < next_beat:
            continue
        next_beat = now + every
        try:
            heartbeat(store, run)
            reason = _topics_changed(task.kafka, selection, known)
            if not reason and mirror is not None and now >= next_mirror:
                next_mirror = now + options.mirror_every_s
                mirror_offsets(store, run, mirror)
        except Fenced as exc:
            # a newer run (or a reset) took the job: the tasks see the newer generation at their
            # next claim or check and stop; nothing more is renewed or mirrored, and the run ends
            # with this error once the Spark job has returned (below) - never with a summary
            fenced, ended = exc, True
            continue
        except TxnOffsetsError as exc:
            logger.warning("job %r epoch %d: the driver's check failed (%s)", run.job, number, exc)
            continue
        if reason:
            ended = _end(store, run, reason)
    if fenced is not None:
        # before the tasks' reports and the Spark job's failure: a fenced run stops, whatever the
        # epoch did (a task that stopped before its next check never saw the fence), and a
        # transient failure must not be planned again (the next plan would only be fenced too)
        if failure:
            logger.info(
                "job %r epoch %d: fenced; its Spark job also failed (%s)",
                run.job,
                number,
                spark_error_summary(failure[0]),
            )
        raise fenced
    if failure:
        error = failure[0]
        if isinstance(error, TxnOffsetsError):
            raise error
        if expired.is_set():
            detail = f"still running long past epoch_s={options.epoch_s:g}s; its Spark job was cancelled"
            raise BatchFailed(run.job, number, detail) from None
        raise BatchFailed(run.job, number, spark_error_summary(error)) from error
    return out


def _end(store: Store, run: Run, reason: str) -> bool:
    logger.info("job %r: ending the epoch early (%s)", run.job, reason)
    try:
        end_epoch(store, run)
    except TxnOffsetsError as exc:
        logger.warning("job %r: could not end the epoch (%s); it ends at its bound", run.job, exc)
    return True


def _topics_changed(kafka: KafkaSettings, selection: TopicSelection, known: set[TopicPartition]) -> str:
    """Why the epoch must be planned again ('' if it need not): a new partition or topic."""
    topics = selection.resolve(kafka, 10.0)
    infos = metadata.describe_topics(kafka, topics, timeout_s=10.0)
    now = {(t, p) for t, info in infos.items() for p in info.partitions}
    new = sorted(now - known)
    return f"new partitions {new[:5]}" if new else ""


def mirror_offsets(store: Store, run: Run, mirror: GroupMirror) -> None:
    """The table's offsets to the consumer group (best effort, as after each batch in batch mode),
    while `run` holds the job: a run fenced since stops its mirror and raises Fenced, sending
    nothing under its old generation (the table's offsets may already be the newer run's)."""
    try:
        with store.connect() as conn:
            rows = offset_rows.load_rows(conn, store.settings, run.job)
            # the generation read after the rows: still ours here, it was ours when they were read
            # (a newer run bumps it before it moves an offset). A fence after this read and before
            # the send is the one-round-trip race GroupMirror documents.
            state = lock_job(conn, store.settings, run.job, for_update=False)
            conn.rollback()
    except TxnOffsetsError as exc:
        logger.warning("job %r: offsets not mirrored (%s)", run.job, exc)
        return
    if state.generation != run.generation:
        mirror.halt(Fenced.__name__)
        raise Fenced(run.job, run.generation, state.generation)
    ids = {k: r.topic_id for k, r in rows.items() if r.topic_id is not None}
    mirror.commit({k: r.off for k, r in rows.items()}, ids)
