"""The claim's arrays travel as one text parameter each (commit.claim.array_literal): PostgreSQL
reads back exactly the values given, whatever the text holds (quotes, backslashes, braces, commas,
the word NULL, spaces, non-ASCII), NULL for None, and integers as themselves."""

from __future__ import annotations

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txn_offsets.commit.claim import array_literal

# PostgreSQL text holds any character but NUL
TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
AWKWARD = st.sampled_from(["NULL", '"', "\\", "{a,b}", " x ", ""])
TEXTS = st.lists(st.one_of(st.none(), TEXT, AWKWARD), max_size=20)
BIGINTS = st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=TEXTS, numbers=BIGINTS)
def test_an_array_literal_reads_back_as_the_values_given(
    engine: sa.Engine, texts: list[str | None], numbers: list[int | None]
) -> None:
    with engine.connect() as conn:
        got_texts, got_numbers = conn.execute(
            sa.text("SELECT CAST(:t AS text[]), CAST(:n AS bigint[])").bindparams(
                sa.bindparam("t", type_=sa.Text), sa.bindparam("n", type_=sa.Text)
            ),
            {"t": array_literal(texts), "n": array_literal(numbers)},
        ).one()
    assert got_texts == texts and got_numbers == numbers
