"""The modes phase's two BatchWriter contenders (benchmarks.contenders): the bench's own, whose
compute is a shuffle (``reduceByKey``), and the one whose compute is one stage (each Spark
partition's partials collected and merged on the driver) - the pair whose ratio tells the mode's
own cost from the shuffle's. Each counts every page view of a topic exactly once, over several
batches, checked against the producer's oracle as every bench run is."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from benchmarks import contenders, sink
from benchmarks.dataset import delete_topics, produce_dataset
from examples import migrate as examples_migrate
from tests.fix_services import Services
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.redaction import Secret


def test_both_batch_writers_count_every_page_view_once(
    spark: Any, services: Services, engine: sa.Engine, migrated: DatabaseSettings
) -> None:
    examples_migrate.upgrade(DatabaseSettings(Secret(services.database_url)))
    kafka = KafkaSettings(services.kafka_bootstrap)
    data = produce_dataset(kafka, 4, 600)
    ctx = contenders.Context(migrated, kafka, data.topic, data.partitions, cap=40)  # 160 offsets a batch
    try:
        for name in ("eo_batch_merged", "eo_batch"):
            sink.clear(engine, data.topic)
            out = contenders.RUNNERS[name](spark, ctx)
            sink.check(engine, data.topic, data.expected, name)  # raises WrongResult unless exact
            assert len(out.commits) >= 4, (name, len(out.commits))  # several batches, each committed
        assert contenders.merge_partials is contenders.MERGING_BATCH_WRITER.compute
    finally:
        sink.clear(engine, data.topic)
        delete_topics(kafka, [data.topic])
