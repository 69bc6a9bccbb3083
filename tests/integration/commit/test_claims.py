"""The one-statement claim of a transaction's ranges (txn_offsets.commit.claim) against the real PostgreSQL:
each range classified exactly as claiming it alone would be, the lineage only when all are claimed,
rows locked in (topic, partition) order whatever the order they are given in."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import Ctx
from tests.integration.helpers import offsets_of, seed
from tests.unproven import commit_ranges
from txn_offsets.commit import Outcome, classify
from txn_offsets.commit import claim as claims
from txn_offsets.commit.classify import ClaimResult
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import Fenced, OffsetConflict, TopicChanged, TxnOffsetsError
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.runs import Run

ID = "topic-id-a"


def _commits(engine: sa.Engine, db: DatabaseSettings, job: str) -> list[tuple[str, int, int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f'SELECT topic, part, from_off, until_off FROM "{db.schema}".commits '
                "WHERE job = :j ORDER BY id"
            ),
            {"j": job},
        )
        return [(r.topic, r.part, r.from_off, r.until_off) for r in rows]


def test_one_statement_claims_a_task_s_ranges_and_records_them(ctx: Ctx) -> None:
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", p): 10 * p for p in range(5)})
    ranges = [OffsetRange("t", p, 10 * p, 10 * p + 3) for p in range(5)]
    assert {o.outcome for o in commit_ranges(ctx.store, ctx.run, ranges, ctx.agg.write)} == {
        Outcome.COMMITTED
    }
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", p): 10 * p + 3 for p in range(5)}
    assert _commits(ctx.engine, ctx.db, ctx.run.job) == [("t", p, 10 * p, 10 * p + 3) for p in range(5)]
    assert ctx.agg.value() == 1
    # the same transaction again (a retried task, a speculative copy): all already committed
    again = commit_ranges(ctx.store, ctx.run, ranges, ctx.agg.write)
    assert {o.outcome for o in again} == {Outcome.ALREADY_COMMITTED}
    assert ctx.agg.calls == 1 and len(_commits(ctx.engine, ctx.db, ctx.run.job)) == 5


def test_some_ranges_committed_by_another_plan_is_a_conflict_and_writes_nothing(ctx: Ctx) -> None:
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", 0): 0, ("t", 1): 0, ("t", 2): 0})
    commit_ranges(ctx.store, ctx.run, [OffsetRange("t", 1, 0, 4)], ctx.agg.write)  # another plan
    mine = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 4), OffsetRange("t", 2, 0, 5)]
    with pytest.raises(OffsetConflict) as info:
        commit_ranges(ctx.store, ctx.run, mine, ctx.agg.write)
    assert (info.value.topic, info.value.partition) == ("t", 1)
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 0, ("t", 1): 4, ("t", 2): 0}
    assert ctx.agg.calls == 1 and _commits(ctx.engine, ctx.db, ctx.run.job) == [("t", 1, 0, 4)]


def test_a_fenced_run_claims_none_of_its_ranges(ctx: Ctx) -> None:
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", 0): 0, ("t", 1): 0})
    stale = Run(ctx.run.job, ctx.run.generation - 1, "stale-run")
    with pytest.raises(Fenced):
        commit_ranges(ctx.store, stale, [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 5)])
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 0, ("t", 1): 0}
    assert _commits(ctx.engine, ctx.db, ctx.run.job) == []


def test_a_range_of_another_topic_incarnation_is_topic_changed(ctx: Ctx) -> None:
    with ctx.engine.begin() as conn:
        from txn_offsets.store import offset_rows

        offset_rows.seed_offsets(
            conn,
            ctx.db,
            ctx.run.job,
            {("t", 0): 0, ("u", 0): 0},
            reason="t",
            actor="pytest",
            topic_ids={"u": "old"},
        )
    ranges = [OffsetRange("t", 0, 0, 5), OffsetRange("u", 0, 0, 5, topic_id="new")]
    with pytest.raises(TopicChanged) as info:
        commit_ranges(ctx.store, ctx.run, ranges, ctx.agg.write)
    assert info.value.topic == "u"
    assert offsets_of(ctx.engine, ctx.db, ctx.run.job) == {("t", 0): 0, ("u", 0): 0}
    assert ctx.agg.calls == 0 and _commits(ctx.engine, ctx.db, ctx.run.job) == []


def test_rows_are_locked_in_key_order_whatever_the_order_given(
    engine: sa.Engine, migrated: DatabaseSettings, run: Run
) -> None:
    """A claim of [p1, p0] waiting behind a holder of p0 has not locked p1: two overlapping claims
    cannot deadlock. After the holder commits, p0 is classified from its newest version."""
    seed(engine, migrated, run.job, {("t", 0): 0, ("t", 1): 0})
    done: dict[str, object] = {}
    with engine.connect() as holder:
        holder.begin()
        assert claims.claim_ranges(holder, migrated, run, [OffsetRange("t", 0, 0, 5)]) == [
            ClaimResult.CLAIMED
        ]

        def second() -> None:
            with engine.connect() as conn, conn.begin():
                try:
                    done["results"] = claims.claim_ranges(
                        conn,
                        migrated,
                        run,
                        [OffsetRange("t", 1, 0, 3), OffsetRange("t", 0, 0, 5)],
                        record=False,
                    )
                except TxnOffsetsError as exc:  # pragma: no cover - reported by the assertion below
                    done["results"] = exc

        waiter = threading.Thread(target=second)
        waiter.start()
        deadline = time.monotonic() + 10
        while not _waiting_on_lock(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting_on_lock(engine), "the second claim never waited for the held row"
        with engine.connect() as probe, probe.begin():  # p1 is free while the second claim waits
            locked = probe.execute(
                sa.text(
                    f'SELECT off FROM "{migrated.schema}".offsets '
                    "WHERE job = :j AND part = 1 FOR UPDATE NOWAIT"
                ),
                {"j": run.job},
            ).scalar_one()
            assert locked == 0
        holder.commit()
        waiter.join(10)
    assert not waiter.is_alive()
    # in the order given: p1 claimed, p0 found at the holder's end (its newest version)
    assert done["results"] == [ClaimResult.CLAIMED, ClaimResult.ALREADY_COMMITTED]


def _waiting_on_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%WITH want AS%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


# Per range: where its row is (relative to the range) and of which incarnation.
STATES = ("at_start", "at_until", "behind", "ahead", "missing", "other_id", "no_id")


@pytest.fixture
def conn(engine: sa.Engine) -> Iterator[sa.Connection]:
    with engine.connect() as c:
        yield c


def _expected(
    job: str, ranges: list[OffsetRange], states: list[str], fenced: bool, gen: int
) -> list[ClaimResult] | type[Exception]:
    """The per-range claims of before (one UPDATE each, then a re-read when it moved no row)."""
    found_gen = gen + 1 if fenced else gen
    out = []
    for r, s in zip(ranges, states, strict=True):
        off = {"at_start": r.start, "at_until": r.until, "behind": r.start - 1, "ahead": r.until + 1}.get(
            s, r.start
        )
        row_id = {"other_id": "other", "no_id": None}.get(s, ID)
        if s == "missing":
            off, row_id = None, None  # type: ignore[assignment]
        if not fenced and off == r.start and (r.topic_id is None or row_id == r.topic_id):
            out.append(ClaimResult.CLAIMED)
            continue
        try:
            out.append(classify.classify_claim(job, r, off, found_gen, gen, found_topic_id=row_id))
        except TxnOffsetsError as exc:
            return type(exc)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cases=st.lists(st.tuples(st.sampled_from(STATES), st.booleans()), min_size=1, max_size=5),
    fenced=st.booleans(),
    record=st.booleans(),
)
def test_each_range_is_classified_as_its_own_claim_would_be(
    conn: sa.Connection,
    migrated: DatabaseSettings,
    run: Run,
    cases: list[tuple[str, bool]],
    fenced: bool,
    record: bool,
) -> None:
    o = f'"{migrated.schema}".offsets'
    ranges = [OffsetRange("t", p, 10, 20, ID if with_id else None) for p, (_, with_id) in enumerate(cases)]
    states = [s for s, _ in cases]
    gen = run.generation
    with conn.begin() as tx:
        if fenced:
            conn.execute(
                sa.text(f'UPDATE "{migrated.schema}".jobs SET generation = :g WHERE job = :j'),
                {"g": gen + 1, "j": run.job},
            )
        for r, s in zip(ranges, states, strict=True):
            if s == "missing":
                continue
            off = {"at_until": r.until, "behind": r.start - 1, "ahead": r.until + 1}.get(s, r.start)
            row_id = {"other_id": "other", "no_id": None}.get(s, ID)
            conn.execute(
                sa.text(f"INSERT INTO {o} (job, topic, part, off, topic_id) VALUES (:j, 't', :p, :off, :id)"),
                {"j": run.job, "p": r.partition, "off": off, "id": row_id},
            )
        expected = _expected(run.job, ranges, states, fenced, gen)
        if isinstance(expected, list):
            got = claims.claim_ranges(conn, migrated, run, ranges, record=record)
            assert got == expected
            rows: dict[int, int] = dict(
                conn.execute(sa.text(f"SELECT part, off FROM {o} WHERE job = :j"), {"j": run.job}).all()
            )
            for r, res in zip(ranges, got, strict=True):  # claimed rows moved; the others did not
                assert (rows[r.partition] == r.until) if res is ClaimResult.CLAIMED else True
            lineage = conn.execute(
                sa.text(f'SELECT count(*) FROM "{migrated.schema}".commits WHERE job = :j'), {"j": run.job}
            ).scalar_one()
            all_claimed = all(res is ClaimResult.CLAIMED for res in got)
            assert lineage == (len(ranges) if record and all_claimed else 0)
        else:
            with pytest.raises(expected):
                claims.claim_ranges(conn, migrated, run, ranges, record=record)
        tx.rollback()


def test_the_transaction_id_comes_with_the_answer_claimed_or_not(ctx: Ctx) -> None:
    """Every range claimed is answered by one row; one not claimed by a row per range: the
    transaction's id is given both ways once it wrote, and not at all for no range."""
    seed(ctx.engine, ctx.db, ctx.run.job, {("t", p): 0 for p in range(3)})
    with ctx.engine.connect() as conn, conn.begin():
        assert claims.claim(conn, ctx.db, ctx.run, []) == claims.Claim([], None)
        all_of_them = claims.claim(conn, ctx.db, ctx.run, [OffsetRange("t", p, 0, 5) for p in range(2)])
        assert all_of_them.results == [ClaimResult.CLAIMED] * 2
        xid = conn.execute(sa.text("SELECT pg_current_xact_id()::text")).scalar_one()
        assert all_of_them.xid == xid
        # partition 0 committed above, partition 2 not yet: the per-range answer
        mixed = claims.claim_ranges(
            conn, ctx.db, ctx.run, [OffsetRange("t", 2, 0, 5), OffsetRange("t", 0, 0, 5)]
        )
        assert mixed == [ClaimResult.CLAIMED, ClaimResult.ALREADY_COMMITTED]
        one = claims.claim(conn, ctx.db, ctx.run, [OffsetRange("t", 1, 0, 5)])
        assert one.results == [ClaimResult.ALREADY_COMMITTED] and one.xid == xid


def test_transaction_outcome_of_mixed_claims() -> None:
    a, b = OffsetRange("t", 0, 0, 1), OffsetRange("t", 1, 0, 1)
    claimed, already = ClaimResult.CLAIMED, ClaimResult.ALREADY_COMMITTED
    assert classify.transaction_outcome("j", [a, b], [claimed, claimed]) is claimed
    assert classify.transaction_outcome("j", [a, b], [already, already]) is already
    with pytest.raises(OffsetConflict) as info:
        classify.transaction_outcome("j", [a, b], [claimed, already])
    assert info.value.partition == 1
