"""The topic checks of migration 0014 (no bounded repetition: the claim's UPDATE and lineage INSERT
check one topic per range) keep 0011's rule exactly, on the real PostgreSQL: for any text, the new
column check, the old one and Kafka's rule ([a-zA-Z0-9._-], 1-249 characters, not "." or "..")
agree, and so do the new and old checks of a stream plan's range."""

from __future__ import annotations

import json
import re

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import migration_scripts
from txn_offsets.config import DatabaseSettings

_KAFKA_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")


M = migration_scripts.load("0014")

LEGAL = st.sampled_from("abzAZ09._-")
OTHER = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))  # PostgreSQL text: no NUL
# lengths around the limit, mostly legal characters, an illegal one anywhere
TOPICS = st.one_of(
    st.text(LEGAL, min_size=0, max_size=4),
    st.text(LEGAL, min_size=247, max_size=252),
    st.builds(lambda a, c, b: a + c + b, st.text(LEGAL, max_size=250), OTHER, st.text(LEGAL, max_size=3)),
    st.sampled_from([".", "..", "...", "end\n", "\nstart", "a" * 249, "a" * 250]),
)


def kafka_legal(topic: str) -> bool:
    return _KAFKA_LEGAL.fullmatch(topic) is not None and topic not in (".", "..")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic=TOPICS)
def test_the_new_checks_answer_as_kafkas_rule_and_the_old_checks(engine: sa.Engine, topic: str) -> None:
    plan = json.dumps([["t", 0, 0, 1], [topic, 1, 0, 1, "id"]])
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                f"SELECT ({M.TOPIC_CHECK}) AS new, ({M.OLD_TOPIC_CHECK}) AS old,"
                f" ({M.PLANS_CHECK}) AS new_plan, ({M.OLD_PLANS_CHECK}) AS old_plan"
                " FROM (SELECT CAST(:t AS text) AS topic, CAST(:r AS jsonb) AS ranges) s"
            ),
            {"t": topic, "r": plan},
        ).one()
    expected = kafka_legal(topic)
    assert (row.new, row.old, row.new_plan, row.old_plan) == (expected,) * 4, repr(topic)


def test_a_migrated_schema_checks_topics_without_a_bounded_repetition(
    engine: sa.Engine, migrated: DatabaseSettings
) -> None:
    with engine.connect() as conn:
        checks = dict(
            conn.execute(
                sa.text(
                    "SELECT conname, pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint"
                    " WHERE connamespace = CAST(:s AS regnamespace) AND contype = 'c'"
                    " AND conname LIKE '%legal%'"
                ),
                {"s": f'"{migrated.schema}"'},
            ).all()
        )
    assert set(checks) == {f"{t}_topic_legal_check" for t in M.TOPIC_COLUMNS} | {M.PLANS_LEGAL}
    assert all("{1,249}" not in text and "+$" in text for text in checks.values()), checks
