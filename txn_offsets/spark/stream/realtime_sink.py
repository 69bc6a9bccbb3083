"""The exactly-once sink of Spark's real-time mode: a ``foreach`` writer (open / process / close).

Real-time mode (``trigger(realTime=...)``, Spark >= 4.1) runs long-running tasks that read Kafka
continuously and hand each row to the writer as it arrives; ``foreachBatch`` is not allowed there.
This writer commits each *group* of a partition's rows with that partition's offset, guarded
exactly like ``run_job``'s ranges (through the commit core, :mod:`txn_offsets.commit`): the claim
is ``off = <stored offset>`` at the run's generation, moving it to ``<last row's offset> + 1``, and
``write(conn, range, rows)`` runs in the same transaction. Spark's Kafka source gives every row
its position (the ``topic``, ``partition`` and ``offset`` columns, which the frame must keep).

* A group is committed once it holds `max_rows` rows, or `max_delay_s` after its first row
  arrived (a flusher thread of the task: a quiet partition does not hold rows back until the
  next row or the end of the epoch), and what is left when the epoch's task closes.
* A task reads its partitions' stored offsets when it first sees them. Rows below the stored
  offset were committed already (Spark replays an epoch from its checkpoint after a restart or a
  task retry; the table is ahead of Spark's checkpoint): they are skipped, not written again.
* A partition whose first row lies ABOVE the stored offset is committed only if Kafka holds
  nothing but transaction markers or aborted records in between (a read_committed look at
  ``[stored, first row)``): a claim from the stored offset to the group's last row would otherwise
  count records the sink never saw (a frame read from a source of its own that started at
  ``latest``). Otherwise StreamDiverged fails the task, nothing written.
* Every group checks (``kafka``: where the rows were read), after its rows were
  read and before they are committed, that the partition's topic still has the Kafka topic id its
  offset row holds (the commit core's proof, :mod:`txn_offsets.commit.proof`): a topic deleted and
  created again under the same name hands Spark's source the NEW topic's records at the stored
  offsets, which must never be committed as the old topic's (TopicChanged fails the task,
  nothing of that group is written).
* A conflict that is not a replay (another writer moved the offset), a newer run (Fenced) or a
  failed write fails the task with the error: that group is not written, the earlier groups stay
  committed and the replay skips them. A partition with no offset row (added after the stream
  started) fails the task too: a new stream seeds it.

It runs in Spark's Python workers, so it is picklable and its state is made in :meth:`open`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from txn_offsets.commit import Outcome, RangeOutcome, Unit, commit_unit
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError, StreamDiverged
from txn_offsets.kafka.reader import read_range
from txn_offsets.ranges import OffsetRange, TopicPartition
from txn_offsets.store.database import translate_errors, worker_engine
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.offset_rows import load_rows
from txn_offsets.store.runs import Run

__all__ = ["RealTimeSink"]

logger = logging.getLogger(__name__)

RowsWrite = Callable[[sa.Connection, OffsetRange, Sequence[Any]], None]


class RealTimeSink:
    """``writeStream.foreach(RealTimeSink(...))``: each partition's rows committed in guarded groups."""

    def __init__(
        self,
        *,
        run: Run,
        database: DatabaseSettings,
        kafka: KafkaSettings,
        write: RowsWrite,
        max_rows: int = 500,
        max_delay_s: float = 0.005,
        isolation_level: str = "READ COMMITTED",
    ) -> None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows <= 0:
            raise ConfigError("max_rows", f"must be a positive whole number, got {max_rows!r}")
        if not 0 <= max_delay_s <= 60:
            raise ConfigError("max_delay_s", f"must be between 0 and 60 seconds, got {max_delay_s!r}")
        self.run, self.database, self.write = run, database, write
        self.max_rows, self.max_delay_s, self.isolation_level = max_rows, max_delay_s, isolation_level
        self.kafka = kafka  # where the rows were read: their topic's incarnation checked per group
        self._task: _Task | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_task": None}  # a task's state never travels

    def commit(self, engine: sa.Engine, unit: Unit) -> list[RangeOutcome]:
        """Commit one group through the commit core (a benchmark's at-least-once sink overrides it)."""
        return commit_unit(engine, self.database, unit, isolation_level=self.isolation_level)

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._task = _Task(self, epoch_id)
        return True

    def process(self, row: Any) -> None:
        if self._task is None:
            raise RuntimeError("RealTimeSink.process() before open()")
        self._task.add(row)

    def close(self, error: BaseException | None) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.finish(failed=error is not None)


class _Task:
    """One task's groups: rows buffered per partition, committed in order by one flusher thread."""

    def __init__(self, sink: RealTimeSink, epoch: int) -> None:
        self.sink, self.epoch = sink, epoch
        self.engine = worker_engine(sink.database)
        self.next: dict[TopicPartition, tuple[int, str | None]] = {}  # the stored offset, its topic id
        self.seen: set[TopicPartition] = set()  # partitions whose first new row was checked
        self.rows: dict[TopicPartition, list[Any]] = {}
        self.first_at: dict[TopicPartition, float] = {}  # when the oldest buffered row arrived
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.closing = False
        self.committed = self.skipped = 0
        self.flusher = threading.Thread(target=self._loop, name="txn-offsets-realtime-flush", daemon=True)
        self.flusher.start()

    def add(self, row: Any) -> None:
        key: TopicPartition = (row["topic"], int(row["partition"]))
        offset = int(row["offset"])
        with self.cond:
            if self.error is not None:
                raise self.error
            if key not in self.next:
                self.next[key] = self._stored(key)
            buffered = self.rows.get(key)
            if not buffered and offset < self.next[key][0]:
                self.skipped += 1  # committed already: a replay of rows the table is ahead of
                return
            if key not in self.seen:  # the partition's first row the table is not ahead of
                self.seen.add(key)
                if offset > self.next[key][0]:
                    self._nothing_below(key, offset)
            if not buffered:
                self.rows[key] = buffered = []
                self.first_at[key] = time.monotonic()
            buffered.append(row)
            if len(buffered) == 1 or len(buffered) >= self.sink.max_rows:
                self.cond.notify()
            # back-pressure: never more than a few groups behind the flusher
            while len(buffered) >= 4 * self.sink.max_rows and self.error is None:
                self.cond.wait(0.1)

    def _stored(self, key: TopicPartition) -> tuple[int, str | None]:
        with translate_errors(self.sink.database), self.engine.connect() as conn:
            row = load_rows(conn, self.sink.database, self.sink.run.job).get(key)
        if row is None:
            raise ConfigError(
                "partition",
                f"{key[0]}[{key[1]}] has no offset row for job {self.sink.run.job!r} (added after the "
                f"stream started?): start a new stream, which seeds it",
            )
        return row.off, row.topic_id

    def _nothing_below(self, key: TopicPartition, offset: int) -> None:
        """Raise StreamDiverged unless Kafka holds no committed record in [stored, `offset`)."""
        start, topic_id = self.next[key]
        gap = OffsetRange(key[0], key[1], start, offset, topic_id)
        with contextlib.closing(read_range(self.sink.kafka, gap, batch_size=1, stall_timeout_s=30.0)) as look:
            found = next(look, None)
        if found is None:
            return  # markers of committed transactions, aborted records: nothing to count
        raise StreamDiverged(
            self.sink.run.job,
            self.sink.run.generation,
            f"the first row of {key[0]}[{key[1]}] is at offset {offset}, but the table stores {start} and "
            f"Kafka holds records in between that the sink never saw (the frame was not read through "
            f"stream.records(), which starts at the stored offsets?); nothing of it was committed",
        )

    def _due(self, now: float) -> list[TopicPartition]:
        limit = self.sink.max_rows
        if self.closing:
            return [k for k, rows in self.rows.items() if rows]
        return [
            k
            for k, rows in self.rows.items()
            if rows and (len(rows) >= limit or now - self.first_at[k] >= self.sink.max_delay_s)
        ]

    def _loop(self) -> None:
        while True:
            with self.cond:
                while True:
                    now = time.monotonic()
                    due = self._due(now)
                    if due or (self.closing and not any(self.rows.values())) or self.error is not None:
                        break
                    waits = [
                        self.first_at[k] + self.sink.max_delay_s - now for k, r in self.rows.items() if r
                    ]
                    self.cond.wait(max(0.0005, min(waits)) if waits else None)
                if not due:
                    return
                groups = []
                for key in due:
                    rows = self.rows[key][: self.sink.max_rows]
                    del self.rows[key][: len(rows)]
                    if self.rows[key]:
                        self.first_at[key] = time.monotonic()
                    groups.append((key, rows))
                self.cond.notify_all()
            try:
                for key, rows in groups:
                    self._commit(key, rows)
            except BaseException as exc:  # handed to the task's thread
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()
                return

    def _commit(self, key: TopicPartition, rows: list[Any]) -> None:
        start, topic_id = self.next[key]
        until = int(rows[-1]["offset"]) + 1
        rng = OffsetRange(key[0], key[1], start, until, topic_id)
        sink = self.sink
        # the rows were read: COMMIT waits for the proof that the topic is the offset row's incarnation
        unit = Unit(
            sink.run, [rng], lambda conn: sink.write(conn, rng, rows), Lineage(self.epoch), source=sink.kafka
        )
        outcomes = sink.commit(self.engine, unit)
        if outcomes[0].outcome is Outcome.ALREADY_COMMITTED:
            logger.info("job=%r %s already committed (a replay)", sink.run.job, rng)
        self.next[key] = (until, topic_id)
        self.committed += len(rows)

    def finish(self, *, failed: bool) -> None:
        """The epoch's task ends: commit what is buffered (not after a failure), then stop."""
        with self.cond:
            if failed:
                self.rows.clear()
            self.closing = True
            self.cond.notify_all()
        self.flusher.join()
        if self.error is not None and not failed:
            raise self.error
        logger.info(
            "job=%r real-time epoch=%d committed=%d skipped=%d rows",
            self.sink.run.job,
            self.epoch,
            self.committed,
            self.skipped,
        )
