"""The lab the `lab` tests of a module share: the running one (``make lab-up``, ``./.lab``) when every
host and service of it is up, else one of their own, brought up in a temporary directory and
brought down after the module."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from txn_offsets.devstack import read_env_file
from txn_offsets.devstack.lab import Lab

CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunningLab:
    """A lab that is up: its object, the driver host's settings, and whether this module started it."""

    lab: Lab
    env: dict[str, str]
    started_here: bool
    up_seconds: float


@pytest.fixture(scope="module")
def running_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    assert os.geteuid() == 0, "the lab tests need root (network namespaces, mounts)"
    shared = Lab(CHECKOUT / ".lab")
    if shared.env_file.exists() and shared.net.namespaces() and shared.status()[1]:
        yield RunningLab(shared, read_env_file(shared.env_file), started_here=False, up_seconds=0.0)
        return
    left = shared.net.leftovers()
    assert not left, f"a lab is partly up ({'; '.join(left)}): run `make lab-down` or `make lab-up` first"
    own = Lab(tmp_path_factory.mktemp("lab") / "lab")
    started = time.monotonic()
    own.up()
    try:
        yield RunningLab(own, read_env_file(own.env_file), started_here=True,
                         up_seconds=time.monotonic() - started)  # fmt: skip
    finally:
        own.down()
