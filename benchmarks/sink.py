"""The one result table every contender writes (``txn_examples.window_counts``, the table of
examples/windowed_counts.py), the two ways of writing it, and the oracle check.

* :func:`write_upsert` - examples/windowed_counts.write: ``upsert_add`` (column arrays through
  ``unnest``, ``ON CONFLICT ... DO UPDATE SET views = views + excluded.views``), what txn_offsets
  jobs write inside their transaction;
* :func:`write_copy` - the write limit: binary COPY into a temporary table, then one
  ``INSERT ... SELECT ... ON CONFLICT`` merge, on the same connection and transaction.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import sqlalchemy as sa

from benchmarks.dataset import Expected, topic_names
from examples import windowed_counts
from examples.schema import window_counts
from txn_offsets.config import KafkaSettings
from txn_offsets.ranges import OffsetRange

Partials = windowed_counts.Partials

_TABLE = f"{window_counts.schema}.{window_counts.name}"
_STAGE = "bench_window_counts_stage"
_COLUMNS = "topic, window_start, page, views, duration_ms"


class WrongResult(Exception):
    """A contender's result table differs from the oracle: its time does not count."""


def write_upsert(conn: sa.Connection, topic: str, partials: Partials) -> None:
    """The write of examples/windowed_counts.py (it only reads the range's topic)."""
    windowed_counts.write(conn, OffsetRange(topic, 0, 0, 0), partials)


def write_copy(conn: sa.Connection, topic: str, partials: Partials) -> None:
    """The same rows through COPY + merge (in the caller's transaction)."""
    if not partials:
        return
    raw: Any = conn.connection.driver_connection  # psycopg.Connection
    with raw.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} "
            f"(LIKE {_TABLE} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        with cur.copy(f"COPY {_STAGE} ({_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "timestamptz", "text", "int8", "int8"])
            for (start, page), (views, duration) in partials.items():
                when = dt.datetime.fromtimestamp(start / 1000, tz=dt.UTC)
                copy.write_row((topic, when, page, views, duration))
        # key order, like upsert_add: concurrent merges of overlapping keys wait, never deadlock
        cur.execute(
            f"INSERT INTO {_TABLE} AS t ({_COLUMNS}) "  # noqa: S608 - fixed identifiers
            f"SELECT {_COLUMNS} FROM {_STAGE} ORDER BY topic, window_start, page "
            "ON CONFLICT (topic, window_start, page) DO UPDATE SET "
            "views = t.views + excluded.views, duration_ms = t.duration_ms + excluded.duration_ms"
        )


def clear(engine: sa.Engine, topic: str) -> None:
    """Remove a topic's rows and vacuum, so that every timed run starts from the same table."""
    _remove(engine, [topic], "ANALYZE")


def _remove(engine: sa.Engine, topics: list[str], vacuum: str) -> None:
    """Delete the rows of `topics`, then ``VACUUM (<vacuum>)`` the table (outside a transaction)."""
    with engine.begin() as conn:
        conn.execute(sa.delete(window_counts).where(window_counts.c.topic.in_(topics)))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"VACUUM ({vacuum}) {_TABLE}"))


# the topics benchmarks.dataset.create_topic names (prefix "bench" or "bench-latency")
BENCH_TOPIC = re.compile(r"bench(-latency)?-p\d+-[0-9a-f]{8}")


def remove_leftovers(engine: sa.Engine, kafka: KafkaSettings) -> tuple[int, int, int]:
    """Before anything is timed: delete the result rows of benchmark topics that Kafka no longer
    has (an interrupted run's, a scratch script's), then VACUUM FULL the table if any went. Every
    contender writes this one table, so rows left in it slow them all, the writers most (8 / 40,000,
    best warm runs: copy_merge 261,954 rec/s over 1.95 million leftover rows, 390,199 over none;
    eo_partition 155,570 and 230,809). Rows of other topics (the demo's) are kept. Returns (rows
    deleted, their topics, rows kept)."""
    with engine.connect() as conn:
        counts = {
            str(r.topic): int(r.n)
            for r in conn.execute(sa.text(f"SELECT topic, count(*) AS n FROM {_TABLE} GROUP BY topic"))  # noqa: S608
        }
    live = set(topic_names(kafka))
    gone = [t for t in counts if BENCH_TOPIC.fullmatch(t) and t not in live]
    if gone:
        _remove(engine, gone, "FULL, ANALYZE")
    deleted = sum(counts[t] for t in gone)
    return deleted, len(gone), sum(counts.values()) - deleted


def stored(engine: sa.Engine, topic: str) -> Expected:
    query = sa.text(
        f"SELECT (extract(epoch FROM window_start) * 1000)::bigint AS w, page, views, duration_ms "  # noqa: S608
        f"FROM {_TABLE} WHERE topic = :topic"
    )
    with engine.connect() as conn:
        return {
            (int(r.w), r.page): (int(r.views), int(r.duration_ms))
            for r in conn.execute(query, {"topic": topic})
        }


def check(engine: sa.Engine, topic: str, expected: Expected, contender: str) -> None:
    """Raise WrongResult unless the topic's rows equal the oracle (views and durations)."""
    got = stored(engine, topic)
    if got == expected:
        return
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    sample = (wrong or missing or extra)[:3]
    detail = ", ".join(f"{k}: got {got.get(k)} expected {expected.get(k)}" for k in sample)
    raise WrongResult(
        f"{contender} on {topic}: {len(wrong)} wrong, {len(missing)} missing, {len(extra)} extra rows "
        f"(views {sum(v for v, _ in got.values())} vs {sum(v for v, _ in expected.values())}); {detail}"
    )
