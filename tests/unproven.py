"""The commit core's commit_ranges for tests that claim ranges whose records they never read.

The incarnation proof is required of every caller (txn_offsets.commit.proof): these tests own no
Kafka source (their topics, often "t", do not exist in Kafka), and say so here once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from txn_offsets import commit
from txn_offsets.commit import NoKafkaSource, RangeOutcome, TransactionWrite
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

NO_RECORDS = NoKafkaSource("a test that claims ranges without reading their records")


def commit_ranges(
    store: Store,
    run: Run,
    ranges: Sequence[OffsetRange],
    write: TransactionWrite | None = None,
    **options: Any,
) -> list[RangeOutcome]:
    options.setdefault("source", NO_RECORDS)
    return commit.commit_ranges(store, run, ranges, write, **options)
