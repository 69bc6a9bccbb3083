"""Two connections racing to commit the same range: exactly one commits, every time.

Both racers call commit_ranges (the function every writer uses) with a writer that increments an
aggregate; the aggregate must equal the number of winners. Under READ COMMITTED the loser blocks
on the claimed row and then sees it moved; under REPEATABLE READ / SERIALIZABLE it gets 40001 and
resolves by re-reading. Both must come out as `already_committed`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.integration.conftest import Ctx
from tests.integration.helpers import Aggregate, offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import Run

RangesFor = Callable[[int, int], list[OffsetRange]]


def _race(
    engine: sa.Engine,
    db: DatabaseSettings,
    run: Run,
    aggregate: Aggregate,
    *,
    races: int,
    ranges_for: RangesFor,
    isolation_level: str,
) -> list[tuple[Outcome, Outcome]]:
    """Run `races` rounds; in round k racer i commits ranges_for(k, i). Returns each round's outcomes."""
    barrier = threading.Barrier(2, timeout=30)
    outcomes: list[list[Outcome]] = [[], []]
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            for k in range(races):
                barrier.wait()
                result = commit_ranges(
                    Store(engine, db), run, ranges_for(k, i), aggregate.write, isolation_level=isolation_level
                )
                assert len({o.outcome for o in result}) == 1  # a batch has one outcome
                outcomes[i].append(result[0].outcome)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            raise

    threads = [threading.Thread(target=racer, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(outcomes[0]) == len(outcomes[1]) == races
    return list(zip(outcomes[0], outcomes[1], strict=True))


def _assert_one_winner_each(rounds: list[tuple[Outcome, Outcome]]) -> None:
    shapes = Counter(tuple(sorted(r)) for r in rounds)
    assert shapes == {(Outcome.ALREADY_COMMITTED, Outcome.COMMITTED): len(rounds)}, shapes


def test_1000_races_read_committed(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run, aggregate: Aggregate
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    started = time.monotonic()
    rounds = _race(
        engine,
        migrated,
        run,
        aggregate,
        races=1000,
        ranges_for=lambda k, _i: [OffsetRange("t", 0, k, k + 1)],
        isolation_level="READ COMMITTED",
    )
    elapsed = time.monotonic() - started
    _assert_one_winner_each(rounds)
    assert aggregate.value() == 1000  # == number of winners
    assert aggregate.calls == 1000  # losers never called write
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 1000}
    assert elapsed < 60, f"1000 races took {elapsed:.1f}s"


@pytest.mark.parametrize("isolation_level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_races_under_snapshot_isolation(
    ctx: Ctx, isolation_level: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine, migrated, run, aggregate = ctx.engine, ctx.db, ctx.run, ctx.agg
    seed(engine, migrated, run.job, {("t", 0): 0})
    caplog.set_level(logging.INFO, logger="txn_offsets.commit.shell")
    rounds = _race(
        engine,
        migrated,
        run,
        aggregate,
        races=300,
        ranges_for=lambda k, _i: [OffsetRange("t", 0, k, k + 1)],
        isolation_level=isolation_level,
    )
    _assert_one_winner_each(rounds)
    # the races really overlapped: some losers got 40001 and were resolved by re-reading
    resolved = [r for r in caplog.records if "sqlstate 40001" in r.getMessage()]
    assert resolved, "no race produced a serialization failure"
    assert aggregate.value() == 300
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 300}


def test_batches_listing_partitions_in_opposite_orders_do_not_deadlock(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run, aggregate: Aggregate
) -> None:
    parts = range(4)
    seed(engine, migrated, run.job, {("t", p): 0 for p in parts})

    def ranges_for(k: int, i: int) -> list[OffsetRange]:
        batch = [OffsetRange("t", p, 10 * k, 10 * k + 10) for p in parts]
        return batch if i == 0 else batch[::-1]

    rounds = _race(
        engine, migrated, run, aggregate, races=200, ranges_for=ranges_for, isolation_level="READ COMMITTED"
    )
    _assert_one_winner_each(rounds)
    assert aggregate.value() == 200
    assert offsets_of(engine, migrated, run.job) == {("t", p): 2000 for p in parts}


@pytest.mark.parametrize("isolation_level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_duplicate_blocks_until_the_first_commits_then_is_already_committed(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    store: Store,
    run: Run,
    aggregate: Aggregate,
    isolation_level: str,
) -> None:
    seed(engine, migrated, run.job, {("t", 0): 0})
    rng = [OffsetRange("t", 0, 0, 7)]
    claimed, release = threading.Event(), threading.Event()
    results: dict[str, Outcome] = {}

    def slow_write(conn: sa.Connection) -> None:
        aggregate.write(conn)
        claimed.set()
        assert release.wait(30)

    def first() -> None:
        results["first"] = commit_ranges(store, run, rng, slow_write)[0].outcome

    def duplicate() -> None:
        results["duplicate"] = commit_ranges(
            store, run, rng, aggregate.write, isolation_level=isolation_level
        )[0].outcome

    t1 = threading.Thread(target=first)
    t1.start()
    assert claimed.wait(30)
    t2 = threading.Thread(target=duplicate)
    t2.start()
    t2.join(timeout=0.5)
    assert t2.is_alive(), "the duplicate did not wait for the claimed row"
    assert aggregate.calls == 1  # and it has written nothing while waiting
    release.set()
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert results == {"first": Outcome.COMMITTED, "duplicate": Outcome.ALREADY_COMMITTED}
    assert aggregate.value() == 1
    assert offsets_of(engine, migrated, run.job) == {("t", 0): 7}
