"""A process that starts a run of a job and holds its lease until killed (the lease takeover tests:
a holder of another process, on this host).

usage: python -m tests.integration.store.lease_holder SCHEMA JOB LEASE_S
(the database URL from TXN_OFFSETS_DATABASE_URL); prints the run as one JSON line, then sleeps.
"""

from __future__ import annotations

import json
import os
import sys
import time

from txn_offsets.config import DatabaseSettings
from txn_offsets.redaction import Secret
from txn_offsets.store.database import engine_for
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


def main(argv: list[str]) -> int:
    schema, job, lease_s = argv
    db = DatabaseSettings(Secret(os.environ["TXN_OFFSETS_DATABASE_URL"]), schema=schema)
    run = start_run(Store(engine_for(db), db), job, lease_s=float(lease_s))
    print(json.dumps({"job": run.job, "generation": run.generation, "run_id": run.run_id}), flush=True)
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
