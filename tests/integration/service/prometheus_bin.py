"""A real Prometheus for the tests: Debian's ``prometheus`` package (prometheus + promtool), installed
when missing and running as root (as the stack installs postgresql), and a server on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml

_POLICY = Path("/usr/sbin/policy-rc.d")


@dataclass(frozen=True)
class Binaries:
    prometheus: Path
    promtool: Path


def _find() -> Binaries | None:
    found = [shutil.which(name) for name in ("prometheus", "promtool")]
    if found[0] and found[1]:
        return Binaries(Path(found[0]), Path(found[1]))
    return None


def binaries() -> Binaries:
    """prometheus and promtool from PATH, or installed from Debian's package (root only)."""
    found = _find()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "prometheus and promtool are not installed: install Debian's `prometheus` package "
            "(`sudo apt-get install --no-install-recommends prometheus`) or put both on PATH"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # only the binaries: never start the package's own service (0.0.0.0:9090) while installing
    own_policy = not _POLICY.exists()
    if own_policy:
        _POLICY.write_text("#!/bin/sh\nexit 101\n")
        _POLICY.chmod(0o755)
    try:
        for cmd in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-400:]}")
    finally:
        if own_policy:
            _POLICY.unlink(missing_ok=True)
    found = _find()
    if found is None:
        raise RuntimeError(
            "Debian's prometheus package was installed but prometheus/promtool are not on PATH"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (an error for a query Prometheus rejects)."""
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
        return [rule for group in body["data"]["groups"] for rule in group["rules"]]


@contextlib.contextmanager
def running(
    bins: Binaries, home: Path, target: str, rule_files: list[Path], job_name: str = "txn-offsets"
) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port scraping `target` every second (rules evaluated every
    second), with its data in `home`; stopped (SIGTERM, then SIGKILL) on exit."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": job_name, "static_configs": [{"targets": [target]}]}],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (home / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(bins.prometheus),
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (home / "prometheus.log").read_text()[-2000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "prometheus did not become ready in 30 s"
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
