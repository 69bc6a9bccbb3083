"""Event-time tumbling-window counts and duration sums per page, exactly once.

Each Spark task reads one offset range, decodes the page views, and reduces them to partial
aggregates per (1-minute window, page) *before* the transaction. The transaction then claims the
range and adds the partials into ``txn_examples.window_counts`` with one additive upsert
(``ON CONFLICT ... DO UPDATE SET views = t.views + excluded.views``, arrays through unnest, never
row by row). A retried or duplicated task finds its range already committed and adds nothing.

    python examples/windowed_counts.py --topic pageviews
"""

from __future__ import annotations

import collections
import datetime as dt
import sys
from collections.abc import Iterator

import sqlalchemy as sa

from examples import common
from examples.pageviews import PageView, decode, window_of
from examples.schema import window_counts
from txn_offsets import OffsetRange, PartitionWriter, upsert_add

Partials = dict[tuple[int, str], list[int]]  # (window start ms, page) -> [views, duration ms]


def aggregate(views: Iterator[PageView]) -> Partials:
    out: Partials = collections.defaultdict(lambda: [0, 0])
    for view in views:
        acc = out[(window_of(view.time_ms), view.page)]
        acc[0] += 1
        acc[1] += view.duration_ms
    return dict(out)


def write(conn: sa.Connection, rng: OffsetRange, partials: Partials) -> None:
    rows = [
        {
            "topic": rng.topic,
            "window_start": dt.datetime.fromtimestamp(start / 1000, tz=dt.UTC),
            "page": page,
            "views": views,
            "duration_ms": duration,
        }
        for (start, page), (views, duration) in partials.items()
    ]
    upsert_add(
        conn, window_counts, rows, keys=["topic", "window_start", "page"], add=["views", "duration_ms"]
    )


WRITER: PartitionWriter[PageView, Partials] = PartitionWriter(write=write, decode=decode, aggregate=aggregate)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0], "windowed-counts").parse_args()
    summary = common.run_example(args, WRITER)
    print(
        f"windowed_counts: records={summary.records} batches={summary.batches} seconds={summary.seconds:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
