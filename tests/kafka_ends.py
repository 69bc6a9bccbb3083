"""Kafka's end offsets as a test may expect them: after everything it produced is readable.

``commit_transaction()`` and ``abort_transaction()`` return once the transaction coordinator has
logged the decision, before the partition leaders have written the commit/abort markers; until
then the partition's LSO (the read_committed end, what the planner and the readers use) stays at
the first offset of that transaction. A test that reads the ends right after producing can
therefore see them short of what it produced (CI: ``assert (0, 6) == (0, 8)`` in
test_reader.py). Call :func:`settled_ends` after producing, transactionally or not, and before
reading or expecting any end offset.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import ServiceUnavailable
from txn_offsets.kafka.metadata import watermarks

TP = tuple[str, int]


def settled_ends(
    kafka: KafkaSettings | str,
    topic: str,
    partitions: int | Iterable[int],
    *,
    timeout_s: float = 30.0,
) -> dict[TP, int]:
    """The read_committed end (LSO) of each partition of `topic` (`partitions`: a count, or the
    partition numbers), once it has reached everything produced to the partition: the LSO equals
    the high watermark, i.e. no transaction is open and every marker is written. Polls for at most
    `timeout_s`, then fails naming the partitions still behind (a producer left a transaction
    open?). A test that keeps a transaction open on purpose asks `watermarks` itself."""
    committed = KafkaSettings(kafka) if isinstance(kafka, str) else kafka
    committed = dataclasses.replace(committed, isolation_level="read_committed")
    everything = dataclasses.replace(committed, isolation_level="read_uncommitted")
    numbers = range(partitions) if isinstance(partitions, int) else sorted(set(partitions))
    tps = [(topic, p) for p in numbers]
    deadline = time.monotonic() + timeout_s
    while True:
        # the LSO first, then the high watermark: the high watermark only grows, so an LSO equal to
        # a high watermark read after it means nothing was open when the LSO was read
        try:
            lso = {tp: end for tp, (_, end) in watermarks(committed, tps).items()}
            hwm = {tp: end for tp, (_, end) in watermarks(everything, tps).items()}
        except ServiceUnavailable as exc:  # e.g. "no leaders found" just after partitions were added
            why = f"Kafka did not answer: {exc}"
        else:
            behind = {tp: (lso[tp], hwm[tp]) for tp in tps if lso[tp] != hwm[tp]}
            if not behind:
                return lso
            shown = ", ".join(
                f"{t}[{p}] LSO {lo} < high watermark {hi}" for (t, p), (lo, hi) in behind.items()
            )
            why = f"{shown} (a transaction still open, or its marker not written)"
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Kafka's read_committed ends did not reach what was produced within {timeout_s:.0f}s: {why}"
            )
        time.sleep(0.05)
