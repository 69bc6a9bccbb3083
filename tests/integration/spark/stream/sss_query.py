"""A Structured Streaming query with Spark's own Kafka source, run in its own process (its session
needs the connector on spark.jars from the start; the tests' shared session has none).

    python -m tests.integration.spark.stream.sss_query BOOTSTRAP TOPIC CHECKPOINT TABLE MAX_PER_TRIGGER

It counts records per key into TABLE (``"schema".name (k text primary key, n bigint)``) with
foreachBatch, processes everything in the topic now (``availableNow``, several batches of at most
MAX_PER_TRIGGER offsets) and stops: its checkpoint then ends with a committed batch. The database
URL comes from TXN_OFFSETS_DATABASE_URL. Prints ``batches=N`` at the end.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import sqlalchemy as sa


def main(bootstrap: str, topic: str, checkpoint: str, table: str, max_per_trigger: str) -> int:
    from txn_offsets.devstack.spark_kafka import spark_kafka_conf
    from txn_offsets.spark.session import local_session

    spark = local_session("sss-import-test", master="local[2]", conf=spark_kafka_conf())
    engine = sa.create_engine(os.environ["TXN_OFFSETS_DATABASE_URL"], pool_size=1)
    upsert = sa.text(
        f"INSERT INTO {table} (k, n) SELECT * FROM unnest(CAST(:ks AS text[]), CAST(:ns AS bigint[])) "
        f"ON CONFLICT (k) DO UPDATE SET n = {table}.n + EXCLUDED.n"
    )
    batches: list[int] = []

    def write(df: Any, batch_id: int) -> None:
        rows = df.groupBy("k").count().collect()
        with engine.begin() as conn:
            if rows:
                conn.execute(upsert, {"ks": [r["k"] for r in rows], "ns": [int(r["count"]) for r in rows]})
        batches.append(batch_id)

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_per_trigger)
        .load()
        .selectExpr("CAST(key AS STRING) AS k")
    )
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    query.stop()
    spark.stop()
    engine.dispose()
    print(f"batches={len(batches)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
