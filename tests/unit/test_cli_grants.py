"""`txn-offsets db grants` prints the run role's GRANTs (no DDL; DELETE only of the lineage and the
runs' history, whose trigger keeps 1,000 generations per job) offline."""

from __future__ import annotations

import pytest

from txn_offsets.cli import main


def test_grants_for_a_role(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "grants", "--role", "job_runner", "--schema", "offsets_x"]) == 0
    out = capsys.readouterr().out
    assert 'GRANT USAGE ON SCHEMA "offsets_x" TO "job_runner";' in out
    assert "CREATE" not in out
    # the DELETEs: the planner prunes the job's expired lineage (commits), the runs' trigger its
    # history past 1,000 generations (job_runs, migration 0013); nothing else
    assert [line for line in out.splitlines() if "DELETE" in line] == [
        'GRANT SELECT, INSERT, DELETE ON "offsets_x".commits TO "job_runner";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON "offsets_x".job_runs TO "job_runner";',
    ]
    assert '"offsets_x".dead_letters' in out


@pytest.mark.parametrize("argv", [["db", "grants"], ["db", "grants", "--role", "bad role;"]])
def test_grants_need_a_valid_role(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 64  # a missing or malformed argument: a usage error
    err = capsys.readouterr().err
    assert err.startswith("txn-offsets: error:") and "role" in err
    assert len(err.strip().splitlines()) == 1
