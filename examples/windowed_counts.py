"""Event-time tumbling-window counts and duration sums per page, exactly once.

Each Spark task reads its offset ranges, decodes the page views, and reduces each range to partial
aggregates per (1-minute window, page) *before* the transaction. The transaction then claims the
task's ranges and adds their partials, merged, into ``txn_examples.window_counts`` with one additive
upsert (``PartitionWriter(write_all=...)``; ``ON CONFLICT ... DO UPDATE SET views = t.views +
excluded.views``, arrays through unnest, never row by row). A retried or duplicated task finds its
ranges already committed and adds nothing.

    python examples/windowed_counts.py --topic pageviews
"""

from __future__ import annotations

import collections
import datetime as dt
import sys
from collections.abc import Iterator, Sequence

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


def write_all(conn: sa.Connection, items: Sequence[tuple[OffsetRange, Partials]]) -> None:
    """The partials of every range the transaction commits, merged per (topic, window, page): ranges
    of one topic's partitions share keys, and one upsert may not name a key twice."""
    merged: dict[tuple[str, int, str], list[int]] = {}
    for rng, partials in items:
        for (start, page), (views, duration) in partials.items():
            acc = merged.setdefault((rng.topic, start, page), [0, 0])
            acc[0] += views
            acc[1] += duration
    rows = [
        {
            "topic": topic,
            "window_start": dt.datetime.fromtimestamp(start / 1000, tz=dt.UTC),
            "page": page,
            "views": views,
            "duration_ms": duration,
        }
        for (topic, start, page), (views, duration) in merged.items()
    ]
    upsert_add(
        conn, window_counts, rows, keys=["topic", "window_start", "page"], add=["views", "duration_ms"]
    )


def write(conn: sa.Connection, rng: OffsetRange, partials: Partials) -> None:
    """One range's partials (as a per-range ``PartitionWriter(write=...)`` would write them)."""
    write_all(conn, [(rng, partials)])


WRITER: PartitionWriter[PageView, Partials] = PartitionWriter(
    write_all=write_all, decode=decode, aggregate=aggregate
)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0], "windowed-counts").parse_args()
    summary = common.run_example(args, WRITER)
    print(
        f"windowed_counts: records={summary.records} batches={summary.batches} seconds={summary.seconds:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
