"""Records and bytes per topic (the original transactional-writes example), per-partition writer.

Each task counts its range's records and value bytes, then claims the range and adds the two
numbers to ``txn_examples.topic_metrics`` in the same transaction.

    python examples/metric_per_topic.py --topic pageviews
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import sqlalchemy as sa

from examples import common
from examples.schema import topic_metrics
from txn_offsets import OffsetRange, PartitionWriter, Record, upsert_add


def measure(records: Iterator[Record]) -> tuple[int, int]:
    n = size = 0
    for rec in records:
        n += 1
        size += len(rec.value or b"")
    return n, size


def write(conn: sa.Connection, rng: OffsetRange, measured: tuple[int, int]) -> None:
    records, size = measured
    # a range of only markers still commits (its offset advances) and adds zero
    upsert_add(
        conn,
        topic_metrics,
        [{"topic": rng.topic, "records": records, "bytes": size}],
        keys=["topic"],
        add=["records", "bytes"],
    )


WRITER: PartitionWriter[Record, tuple[int, int]] = PartitionWriter(write=write, aggregate=measure)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0], "metric-per-topic").parse_args()
    summary = common.run_example(args, WRITER)
    print(f"metric_per_topic: records={summary.records} batches={summary.batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
