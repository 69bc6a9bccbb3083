"""``make demo`` as a subprocess, small: the README's first command must keep working (its import of
the offsets store once broke without any test noticing). The demo checks every total and every
stored offset against what it produced and prints ``verified=ok``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.fix_services import REPO, Services


def test_demo_smoke(services: Services) -> None:
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": services.database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--messages", "3000", "--max-per-partition", "200"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"demo: messages=3000 batches=\d+ seconds=[\d.]+ verified=ok", last), last
