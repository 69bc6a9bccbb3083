"""A small run of ``make bench``: every variant's results are checked against the oracle inside
the benchmark (a wrong count exits non-zero); here we check it ran all three and reported them.
No timing is asserted: performance claims come from ``make bench`` itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.fix_services import REPO, Services


def test_bench_smoke(services: Services) -> None:
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": services.database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--messages", "5000"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = dict(
        re.findall(r"^  (txn_offsets|no_offsets|per_record_rows)\s+([\d.]+)", done.stdout, re.MULTILINE)
    )
    assert set(rows) == {"txn_offsets", "no_offsets", "per_record_rows"}
    assert all(float(seconds) > 0 for seconds in rows.values())
    assert "bench: 5,000 page views" in done.stdout
