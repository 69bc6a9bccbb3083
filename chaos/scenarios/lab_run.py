"""``python -m chaos --lab``: the running lab (or one brought up for the session and down after it),
then the same command again on its driver host, with the lab's settings.

The scenarios run on the driver host as a user's job would: its names resolve there
(``ip netns exec``), its settings are ``<lab>/env``'s (the owner's database URL as
TXN_OFFSETS_DATABASE_URL: chaos creates and drops schemas). Root only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from chaos.procs import REPO
from txn_offsets.devstack import read_env_file
from txn_offsets.devstack.lab import Lab

__all__ = ["INSIDE", "on_the_lab"]

#: set in the re-run on the driver host
INSIDE = "CHAOS_ON_LAB_HOST"


def on_the_lab(argv: Sequence[str], lab_dir: Path) -> int:
    """Run ``python -m chaos <argv>`` on the lab's driver host; its exit code."""
    if os.geteuid() != 0:
        print("chaos: --lab needs root (network namespaces): run it as root", file=sys.stderr)
        return 2
    lab = Lab(lab_dir)
    started_here = False
    if lab.env_file.exists() and lab.net.namespaces() and lab.status()[1]:
        print(f"chaos: using the running lab ({lab.dir})", flush=True)
    else:
        left = lab.net.leftovers()
        if left:
            print(f"chaos: a lab is partly up ({'; '.join(left)}): run `make lab-down`", file=sys.stderr)
            return 2
        up = lab.up()
        started_here = True
        print(f"chaos: lab up in {up.seconds:.0f} s ({lab.dir}); it goes down after the session", flush=True)
    settings = read_env_file(lab.env_file)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TXN_OFFSETS_", "PYSPARK_", "SPARK_"))}
    env |= settings | {
        "TXN_OFFSETS_DATABASE_URL": settings["TXN_OFFSETS_OWNER_DATABASE_URL"],
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        INSIDE: "1",
    }
    driver = lab.net.netns(lab.net.host("driver"))
    try:
        done = subprocess.run(["ip", "netns", "exec", driver, sys.executable, "-m", "chaos", *argv],
                              env=env, cwd=REPO, check=False)  # fmt: skip
        return done.returncode
    finally:
        if started_here:
            lab.down()
