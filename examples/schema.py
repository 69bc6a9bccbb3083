"""Result tables of the examples, in their own Postgres schema (``txn_examples``), separate from the
library's offsets schema. These Core tables are what the example jobs write and what the examples'
alembic migrations (``examples/migrations``) create."""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA = "txn_examples"
metadata = sa.MetaData(schema=SCHEMA)

# metric_per_topic.py: records and bytes per topic
topic_metrics = sa.Table(
    "topic_metrics",
    metadata,
    sa.Column("topic", sa.Text, primary_key=True),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
)

# windowed_counts.py: event-time tumbling windows per page
window_counts = sa.Table(
    "window_counts",
    metadata,
    sa.Column("topic", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("page", sa.Text, primary_key=True),
    sa.Column("views", sa.BigInteger, nullable=False),
    sa.Column("duration_ms", sa.BigInteger, nullable=False),
)

# top_keys_per_batch.py: the most frequent keys of each batch (computed with a shuffle)
top_keys = sa.Table(
    "top_keys",
    metadata,
    sa.Column("job", sa.Text, primary_key=True),
    sa.Column("batch_id", sa.Text, primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
)

# idempotent_events.py: one row per record, keyed by its coordinates
events = sa.Table(
    "events",
    metadata,
    sa.Column("topic", sa.Text, primary_key=True),
    sa.Column("part", sa.Integer, primary_key=True),
    sa.Column("off", sa.BigInteger, primary_key=True),
    sa.Column("key", sa.Text),
    sa.Column("page", sa.Text),
    sa.Column("event_time", sa.DateTime(timezone=True)),
)
