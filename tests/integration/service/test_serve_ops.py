"""`txn-offsets serve` as an operator runs it: a retired job gives no series (the shipped alert
rules would page for a retired job with lag as STOPPED), and the status thresholds come from the
command line (--stall-after-s, --trend-window-s, --fenced-hold-s), checked at parse time."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx2 as httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import Cli, produce_counts, seed
from txn_offsets.cli.main import main as cli_main
from txn_offsets.config import DatabaseSettings
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run


@contextmanager
def serving(env: dict[str, str], schema: str, *flags: str) -> Iterator[str]:
    cmd = [sys.executable, "-m", "txn_offsets.cli", "serve", "--schema", schema, "--port", "0", *flags]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
        assert match, line + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        deadline = time.monotonic() + 15
        while httpx.get(f"{match.group(1)}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "serve never got ready"
            time.sleep(0.1)
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


def _env(database_url: str, kafka_bootstrap: str) -> dict[str, str]:
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    env.pop("TXN_OFFSETS_SERVE_TOKEN", None)
    return env


def _series(url: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def test_retired_jobs_give_no_series(
    run_cli: Cli,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    database_url: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    topic = topic_factory(partitions=1)
    produce_counts(kafka_bootstrap, topic, {0: 6})
    active, retired = job_name + "-active", job_name + "-retired"
    for job in (active, retired):
        start_run(Store(engine, migrated), job)
        seed(engine, migrated, job, {(topic, 0): 1})  # lag 5 each
    code, _, err = run_cli(
        "jobs", "retire", "--job", retired, "--reason", "gone", "--force", "--schema", migrated.schema
    )
    assert code == 0, err

    with serving(_env(database_url, kafka_bootstrap), migrated.schema) as url:
        series = _series(url)
        jobs = {labels.get("txn_job") or labels.get("consumergroup") for _n, labels, _v in series} - {None}
        assert jobs == {active}, jobs  # nothing of the retired job: no STOPPED-with-lag to page on
        status = {labels["status"] for n, labels, v in series if n == "txn_offsets_job_status" and v == 1}
        assert status == {"OK"}
        assert [v for n, _l, v in series if n == "txn_offsets_jobs_retired"] == [1.0]
        listed = httpx.get(f"{url}/offsets", timeout=30).json()
        assert [j["job"] for j in listed["jobs"]] == [active] and listed["retired_jobs"] == [retired]
        one = httpx.get(f"{url}/offsets/{retired}", timeout=30)
        assert one.status_code == 404 and "retired" in one.json()["error"]


def test_one_job_is_its_own_object(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    database_url: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
) -> None:
    """/offsets/{job} is the job's object, as it is in /offsets's list, with the view's context
    beside its fields (before: the object under the plural "jobs" key)."""
    topic = topic_factory(partitions=1)
    produce_counts(kafka_bootstrap, topic, {0: 6})
    run = start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {(topic, 0): 2})
    with serving(_env(database_url, kafka_bootstrap), migrated.schema) as url:
        listed = httpx.get(f"{url}/offsets", timeout=30).json()
        one = httpx.get(f"{url}/offsets/{job_name}", timeout=30)
    assert one.status_code == 200 and one.headers["content-type"] == "application/json"
    body = one.json()
    assert "jobs" not in body and "retired_jobs" not in body
    assert (body["job"], body["generation"], body["state"], body["total_lag"]) == (
        job_name,
        run.generation,
        "live",
        4,
    )
    assert [(p["topic"], p["partition"], p["offset"], p["lag"]) for p in body["partitions"]] == [
        (topic, 0, 2, 4)
    ]
    context = ("schema", "isolation_level", "kafka_error", "kafka_facts_at")
    assert {k: body[k] for k in context if k != "kafka_facts_at"} == {
        "schema": migrated.schema,
        "isolation_level": "read_committed",
        "kafka_error": None,
    }
    (listed_job,) = [j for j in listed["jobs"] if j["job"] == job_name]
    assert {k: v for k, v in body.items() if k not in context} == {
        **listed_job,
        "heartbeat_age_s": body["heartbeat_age_s"],  # read a moment later
        "partitions": body["partitions"],
    }
    assert set(listed) == {*context, "jobs", "retired_jobs"}


def test_status_thresholds_from_the_command_line(
    engine: sa.Engine,
    migrated: DatabaseSettings,
    job_name: str,
    database_url: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory(partitions=1)
    produce_counts(kafka_bootstrap, topic, {0: 4})
    start_run(Store(engine, migrated), job_name)  # a live run whose offset does not move while there is lag
    seed(engine, migrated, job_name, {(topic, 0): 0})
    env = _env(database_url, kafka_bootstrap)

    def status(url: str) -> str:
        return str(httpx.get(f"{url}/offsets/{job_name}", timeout=30).json()["status"])

    with serving(env, migrated.schema) as url:
        assert status(url) == "OK"  # the default: 10 minutes before STALLED
    time.sleep(1.2)
    flags = ("--stall-after-s", "1", "--trend-window-s", "30", "--fenced-hold-s", "60")
    with serving(env, migrated.schema, *flags) as url:
        assert status(url) == "STALLED"

    # a bad threshold: usage error 64 and one line naming the flag (the real command once; every
    # other value through the same entry point in this process: 15 interpreters took ~12 s)
    argv = ["serve", "--schema", migrated.schema, "--port", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "txn_offsets.cli", *argv, "--stall-after-s", "soon"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 64 and "--stall-after-s" in done.stderr and done.stderr.count("\n") == 1
    for flag in ("--stall-after-s", "--trend-window-s", "--fenced-hold-s"):
        for bad in ("0", "-5", "nan", "inf", "soon"):
            assert cli_main([*argv, flag, bad]) == 64
            err = capsys.readouterr().err
            assert flag in err and err.count("\n") == 1, err
