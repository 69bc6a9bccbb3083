"""``make demo`` as a subprocess, small: the README's first command must keep working (its import of
the offsets store once broke without any test noticing). The demo checks every total and every
stored offset against what it produced and prints ``verified=ok``."""

from __future__ import annotations

import re

from tests.fix_services import Services, run_module


def test_demo_smoke(services: Services) -> None:
    args = ("--messages", "3000", "--max-per-partition", "200")
    done = run_module("examples.demo", *args, env=services.environ(), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"demo: messages=3000 batches=\d+ seconds=[\d.]+ verified=ok", last), last
