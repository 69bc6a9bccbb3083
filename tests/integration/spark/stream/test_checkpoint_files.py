"""How a run's streaming query writes its checkpoint (txn_offsets.spark.stream.running): on the local
file system through Hadoop's FileSystem API (Spark's default, the FileContext API, starts a
``readlink`` process per link status without Hadoop's native library), for that query only - the
session's own setting is back as it was once the query is built, and a manager the application
chose itself stands. Real Spark (the test session's), Kafka and PostgreSQL."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.spark.counting import Counting, key_counts
from tests.integration.spark.stream.test_streaming import write_counts
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.spark.stream.running import FILE_SYSTEM_MANAGERS, MANAGER_SETTING, file_system_manager

FILE_CONTEXT_MANAGERS = tuple(
    name.replace("FileSystemBased", "FileContextBased") for name in FILE_SYSTEM_MANAGERS
)


def _loadable(spark: Any, names: tuple[str, ...]) -> str:
    return next(name for name in names if spark._jvm.org.apache.spark.util.Utils.classIsLoadable(name))


def _managers(query: Any) -> tuple[str, str]:
    """The classes that write the query's offset log and commit log."""
    execution = query._jsq.streamingQuery()
    return (
        str(execution.offsetLog().fileManager().getClass().getName()),
        str(execution.commitLog().fileManager().getClass().getName()),
    )


@pytest.fixture
def session_setting(spark: Any) -> Iterator[None]:
    """The session's checkpoint manager setting, as it was before the test, after it."""
    before = spark.conf.get(MANAGER_SETTING, None)
    yield
    if before is None:
        spark.conf.unset(MANAGER_SETTING)
    else:
        spark.conf.set(MANAGER_SETTING, before)


def _count(spark: Any, counting: Counting, checkpoints: Path, n: int) -> Any:
    topic, _ = counting.topic(2)
    expected = counting.produce(topic, n, 2)
    options = counting.stream_options(topic, checkpoints)
    with open_stream(
        spark, start=StartPolicy.earliest(), limits=Limits(max_records_per_batch=40), **options
    ) as stream:
        query = stream.start(
            compute_df=key_counts, write=functools.partial(write_counts, counting.table), available_now=True
        )
        query.awaitTermination(300)
        assert query.exception() is None
    assert counting.totals() == dict(expected)
    return query


def test_a_local_checkpoint_is_written_through_the_file_system_api_for_that_query_only(
    spark: Any, counting: Counting, tmp_path: Path, session_setting: None
) -> None:
    spark.conf.unset(MANAGER_SETTING)
    query = _count(spark, counting, tmp_path, 100)  # 100 records, 40 a batch: 3 batches
    manager = _loadable(spark, FILE_SYSTEM_MANAGERS)
    assert _managers(query) == (manager, manager)
    assert spark.conf.get(MANAGER_SETTING, None) is None  # the session's setting as it was
    assert len(query.recentProgress) >= 3
    # the query's logs are in the checkpoint, one file per batch as with Spark's default manager
    (checkpoint,) = tmp_path.glob(f"*/{counting.job}/generation-*")
    assert sorted(p.name for p in (checkpoint / "offsets").iterdir() if not p.name.startswith(".")) == [
        str(i) for i in range(len(query.recentProgress))
    ]


def test_a_manager_the_application_chose_stands(
    spark: Any, counting: Counting, tmp_path: Path, session_setting: None
) -> None:
    chosen = _loadable(spark, FILE_CONTEXT_MANAGERS)
    spark.conf.set(MANAGER_SETTING, chosen)
    query = _count(spark, counting, tmp_path, 50)
    assert _managers(query) == (chosen, chosen)
    assert spark.conf.get(MANAGER_SETTING) == chosen


def test_only_the_local_file_system_gets_the_file_system_manager(
    spark: Any, tmp_path: Path, session_setting: None
) -> None:
    spark.conf.unset(MANAGER_SETTING)
    manager = _loadable(spark, FILE_SYSTEM_MANAGERS)
    assert file_system_manager(spark, str(tmp_path)) == manager
    assert file_system_manager(spark, f"file://{tmp_path}") == manager
    assert file_system_manager(spark, "relative/checkpoints") == manager  # fs.defaultFS: file:/// here
    # no file system for the scheme here (s3a needs hadoop-aws): Spark's own start reports it
    assert file_system_manager(spark, "s3a://bucket/checkpoints") is None
    assert file_system_manager(spark, "no-such-fs://host/checkpoints") is None
    spark.conf.set(MANAGER_SETTING, manager)
    assert file_system_manager(spark, str(tmp_path)) is None  # chosen already: left as it is
