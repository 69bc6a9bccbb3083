"""The 10 most active users of each batch: a result that needs a shuffle, so a per-batch writer.

Spark counts views per user over the whole batch (``reduceByKey`` shuffles across ranges) and
takes the top 10; the driver then claims every range of the batch and writes the ranking in ONE
transaction. The batch id is derived from the ranges, so a replay of the same batch is recognised
(already committed) and writes nothing.

    python examples/top_keys_per_batch.py --topic pageviews
"""

from __future__ import annotations

import hashlib
import operator
import sys
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from examples import common
from examples.pageviews import decode
from examples.schema import top_keys
from txn_offsets import BatchWriter, OffsetRange

TOP = 10
Ranking = tuple[int, list[tuple[str, int]]]  # (records in the batch, [(user, views)])


def batch_id(ranges: Sequence[OffsetRange]) -> str:
    return hashlib.sha256("|".join(map(str, sorted(ranges))).encode()).hexdigest()[:32]


def compute(records: Any) -> Ranking:
    users = records.map(lambda r: (decode(r).user, 1)).reduceByKey(operator.add)
    top = users.takeOrdered(TOP, key=lambda kv: (-kv[1], kv[0]))
    return int(users.values().sum()), top


def make_writer(job: str) -> BatchWriter[Ranking]:
    def write(conn: sa.Connection, ranges: Sequence[OffsetRange], ranking: Ranking) -> None:
        total, top = ranking
        if not top:
            return
        bid = batch_id(ranges)
        conn.execute(
            sa.insert(top_keys),
            [
                {"job": job, "batch_id": bid, "rank": i + 1, "key": k, "n": n, "records": total}
                for i, (k, n) in enumerate(top)
            ],
        )

    return BatchWriter(compute=compute, write=write)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0], "top-keys-per-batch").parse_args()
    summary = common.run_example(args, make_writer(args.job))
    print(f"top_keys_per_batch: records={summary.records} batches={summary.batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
