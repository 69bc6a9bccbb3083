"""``python -m chaos`` (``make chaos``): the seeded fault-injection suite.

``--lab``: the lab scenarios L1-L8 (chaos/scenarios/lab*.py) on the lab (``make chaos-lab``, root).

Knobs (flags win over the environment): CHAOS_SEED (default 1), CHAOS_RUNS (F1 driver kills,
default 50), CHAOS_MESSAGES (default 1,000,000), CHAOS_SCENARIOS (comma list, default all),
CHAOS_WORK_DIR (job logs, default $TMPDIR/txn-offsets-chaos). Services come from TXN_OFFSETS_DATABASE_URL,
TXN_OFFSETS_ADMIN_DATABASE_URL, TXN_OFFSETS_KAFKA_BOOTSTRAP and TXN_OFFSETS_STACK_DIR (``.stack/env``).

The last line is ``chaos: runs=R faults=F messages=M lost=L duplicated=D``; the exit code is 0 only
if L = D = 0 and every invariant held.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from chaos.procs import REPO
from chaos.scenarios import SCENARIOS, Services
from chaos.scenarios.lab_run import INSIDE, on_the_lab
from chaos.suite import FULL, LAB, LAB_MESSAGES, SMOKE, run_suite


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=int(env.get("CHAOS_SEED", "1")))
    p.add_argument("--runs", type=int, default=int(env.get("CHAOS_RUNS", "50")), help="F1 driver kills")
    p.add_argument(
        "--messages",
        type=int,
        default=int(env.get("CHAOS_MESSAGES", "0")),
        help=f"default 1,000,000 (--lab: {LAB_MESSAGES:,})",
    )
    p.add_argument("--scenarios", default=env.get("CHAOS_SCENARIOS", ""), help="e.g. F1,F3 (default: all)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the smoke subset of make test (F1, F2 at its five forced points, F11)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path(env.get("CHAOS_WORK_DIR", Path(tempfile.gettempdir()) / "txn-offsets-chaos")),
    )
    p.add_argument("--keep", action="store_true", help="keep the topics and schemas for inspection")
    p.add_argument(
        "--lab",
        action="store_true",
        help="the lab scenarios (L1-L8) on the lab's driver host (root; uses the running lab, else brings "
        "one up for the session)",
    )
    p.add_argument("--lab-dir", type=Path, default=Path(env.get("LAB_DIR", REPO / ".lab")))
    args = p.parse_args(argv)
    if args.lab and not env.get(INSIDE):
        return on_the_lab(sys.argv[1:] if argv is None else argv, args.lab_dir)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [k for k in ("TXN_OFFSETS_DATABASE_URL", "TXN_OFFSETS_KAFKA_BOOTSTRAP") if not env.get(k)]
    if missing:
        print(f"chaos: {', '.join(missing)} not set (`set -a; . .stack/env; set +a`)", file=sys.stderr)
        return 2
    names = LAB if args.lab else SMOKE if args.smoke else FULL
    messages = args.messages or (LAB_MESSAGES if args.lab else 1_000_000)
    if args.scenarios:
        known = {name.lower(): name for name in SCENARIOS}  # f12b -> F12b
        names = tuple(known.get(n.strip().lower(), n.strip()) for n in args.scenarios.split(",") if n.strip())
    stack = env.get("TXN_OFFSETS_STACK_DIR")
    services = Services(
        database_url=env["TXN_OFFSETS_DATABASE_URL"],
        admin_database_url=env.get("TXN_OFFSETS_ADMIN_DATABASE_URL") or env["TXN_OFFSETS_DATABASE_URL"],
        kafka_bootstrap=env["TXN_OFFSETS_KAFKA_BOOTSTRAP"],
        stack_dir=Path(stack) if stack else None,
    )
    work = args.work_dir / f"seed-{args.seed}-{int(time.time())}"
    t0 = time.monotonic()
    report = run_suite(
        services,
        seed=args.seed,
        names=names,
        messages=messages,
        kills=args.runs,
        work_dir=work,
        keep=args.keep,
        drawn_faults=not args.smoke,
    )
    for line in report.details():
        print(line)
    print(f"  seconds={time.monotonic() - t0:.0f} logs={work}")
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
