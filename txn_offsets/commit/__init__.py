"""THE guard, and the only place it lives: every mode builds units and commits them here.

* :mod:`.claim` - the claim statement (``off = from``, the run's generation, the planned topic id,
  the lineage rows) and :mod:`.classify`, what a claim or a re-read means;
* :mod:`.proof` - the topic-incarnation proof, required of every unit (or an explicit
  :class:`NoKafkaSource`);
* :mod:`.unit` - the Unit a mode builds and the Outcome of each range; :mod:`.staging` - the rules
  every unit builder follows between its read and the commit;
* :mod:`.shell` - ONE transaction shell for 1..N units.

A user's own Python code commits through the same shell::

    from txn_offsets.commit import Unit, commit_units
    commit_units(engine, db, [Unit(run, ranges, write, source=kafka)])

(``commit_ranges(store, run, ranges, write, source=kafka)``, on the driver's
:class:`~txn_offsets.store.handle.Store`, is the same for one unit).
No other module of txn_offsets claims, classifies a claim or proves an incarnation
(tests/unit/test_layout.py keeps the rule).
"""

from __future__ import annotations

from collections.abc import Sequence

from txn_offsets.commit.proof import NoKafkaSource, Source
from txn_offsets.commit.shell import UnitResult, commit_unit, commit_units
from txn_offsets.commit.unit import ISOLATION_LEVELS, Outcome, RangeOutcome, TransactionWrite, Unit
from txn_offsets.ranges import OffsetRange
from txn_offsets.store.handle import Store
from txn_offsets.store.lineage import Lineage
from txn_offsets.store.runs import Run

__all__ = [
    "ISOLATION_LEVELS",
    "NoKafkaSource",
    "Outcome",
    "RangeOutcome",
    "Source",
    "TransactionWrite",
    "Unit",
    "UnitResult",
    "commit_ranges",
    "commit_unit",
    "commit_units",
]


def commit_ranges(
    store: Store,
    run: Run,
    ranges: Sequence[OffsetRange],
    write: TransactionWrite | None = None,
    *,
    source: Source,
    isolation_level: str = "READ COMMITTED",
    max_attempts: int = 3,
    lineage: Lineage | None = None,
) -> list[RangeOutcome]:
    """Claim `ranges` under `run`, run ``write(conn)`` in the same transaction, prove the topics
    (`source`: the KafkaSettings the records were read with, or NoKafkaSource(reason)), commit;
    the outcomes in `ranges`' order. One unit of :func:`commit_unit`, which says what it raises."""
    unit = Unit(run, ranges, write, lineage, source=source)
    return commit_unit(
        store.engine, store.settings, unit, isolation_level=isolation_level, max_attempts=max_attempts
    )
