"""For comparison: one row per record, keyed by (topic, partition, offset), inserted idempotently.

This is the other common way to get "effectively once": every record becomes a row whose key is its
Kafka coordinates, and duplicates are dropped with ``ON CONFLICT DO NOTHING``. It needs no offset
claim to be correct, but it stores every record and cannot keep aggregates; here it still runs
through the runner so its offsets live next to the rows and restarts resume exactly.

    python examples/idempotent_events.py --topic pageviews
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from examples import common
from examples.pageviews import decode
from examples.schema import events
from txn_offsets import OffsetRange, PartitionWriter, Record

Row = dict[str, object]


def to_rows(records: Iterator[Record]) -> list[Row]:
    rows: list[Row] = []
    for rec in records:
        view = decode(rec)
        rows.append(
            {
                "topic": rec.topic,
                "part": rec.partition,
                "off": rec.offset,
                "key": view.user,
                "page": view.page,
                "event_time": dt.datetime.fromtimestamp(view.time_ms / 1000, tz=dt.UTC),
            }
        )
    return rows


def write(conn: sa.Connection, rng: OffsetRange, rows: list[Row]) -> None:
    if rows:
        # one multi-row INSERT (SQLAlchemy batches the VALUES), duplicates ignored by key
        conn.execute(insert(events).on_conflict_do_nothing(index_elements=["topic", "part", "off"]), rows)


WRITER: PartitionWriter[Record, list[Row]] = PartitionWriter(write=write, aggregate=to_rows)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0], "idempotent-events").parse_args()
    summary = common.run_example(args, WRITER)
    print(f"idempotent_events: records={summary.records} batches={summary.batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
