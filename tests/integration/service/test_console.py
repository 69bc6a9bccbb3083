"""The console's pages over HTTP against real PostgreSQL and Kafka (the browser tests drive the same
pages in chromium): what each page says about real jobs, the token (header, login cookie), the
loopback rule without a token, the security headers, escaping, pagination."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from tests.integration.helpers import Cli, seed
from tests.integration.service.console_jobs import HOSTILE_REASON, REASON, ConsoleJobs, jobs_for
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.kafka.records import Record
from txn_offsets.redaction import Secret
from txn_offsets.service.app import LoopbackHostsOnly, Service, create_app
from txn_offsets.service.console import LagHistory
from txn_offsets.service.console.auth import COOKIE
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.store.dead_letters import DeadLetter, write_dead_letters
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import start_run

TOKEN = "console-token-0123456789abcdef"


@pytest.fixture
def jobs(request: pytest.FixtureRequest) -> ConsoleJobs:
    return jobs_for(request)


@pytest.fixture
def serve(
    engine: sa.Engine, migrated: DatabaseSettings, kafka_bootstrap: str
) -> Iterator[Callable[..., TestClient]]:
    made: list[tuple[TestClient, Service]] = []

    def make(token: str | None = None, *, loopback_rule: bool = False) -> TestClient:
        service = Service(
            Store(engine, migrated),
            KafkaView(KafkaSettings(kafka_bootstrap), ttl_s=0),
            Secret(token) if token else None,
            grafana="https://grafana.example",
            history=LagHistory(every_s=0.0),  # every snapshot a sample: a line after two
        )
        app = create_app(service)
        client = TestClient(LoopbackHostsOnly(app) if loopback_rule else app, base_url="http://127.0.0.1")
        made.append((client, service))
        return client

    yield make
    for client, service in made:
        client.close()
        service.close()


def _row(html: str, job_html: str) -> str:
    """The overview's table row of a job (its name as the page shows it)."""
    match = re.search(r"<tr><td><a href=\"[^\"]+\">" + re.escape(job_html) + r"</a>.*?</tr>", html)
    assert match, f"no row for {job_html} in the overview"
    return match.group(0)


def test_overview_job_page_and_lineage(
    jobs: ConsoleJobs, serve: Callable[..., TestClient], run_cli: Cli
) -> None:
    client = serve()
    first = client.get("/console/")
    assert first.status_code == 200, first.text
    jobs.fence(run_cli)  # after a first look: the service sees the fencing counter go up
    page = client.get("/console/").text
    assert 'class="status running">running<' in _row(page, jobs.running)
    assert 'class="status fenced">fenced<' in _row(page, jobs.fenced)
    assert 'class="status idle">idle<' in _row(page, jobs.done)
    # lag: the running job committed 4 of partition 0's 10 records and none of partition 1's 6
    assert '<td class="n">12</td>' in _row(page, jobs.running)
    assert '<td class="n">0</td><td class="n">0.0</td>' in _row(page, jobs.done)
    assert "https://grafana.example/d/txn-offsets/txn-offsets" in page
    assert "<svg" in _row(page, jobs.running)  # two snapshots: a line

    job = client.get(f"/console/jobs/{jobs.fenced}").text
    assert REASON in job and "reset" in job
    assert f"fenced by generation {jobs.fenced_run.generation + 1} (reset by" in job  # runs (0013)
    done = client.get(f"/console/jobs/{jobs.done}").text
    assert "finished (lease released)" in done and jobs.done_run.run_id in done

    found = client.get(
        "/console/lineage", params={"job": jobs.done, "topic": jobs.topic, "partition": "0", "offset": "5"}
    ).text
    assert (
        f"committed in [0, 10) by run {jobs.done_run.run_id} (generation {jobs.done_run.generation})" in found
    )
    bad = client.get(
        "/console/lineage", params={"job": jobs.done, "topic": jobs.topic, "partition": "x", "offset": "1"}
    )
    assert bad.status_code == 400 and "whole numbers" in bad.text
    assert client.get("/console/jobs/no-such-job").status_code == 404


def test_stored_text_is_escaped(jobs: ConsoleJobs, serve: Callable[..., TestClient]) -> None:
    client = serve()
    page = client.get("/console/").text
    assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;&lt;b&gt;" in page
    job = client.get("/console/jobs/" + jobs.hostile).text
    assert "<script>" not in job and "\x1b" not in job and "\u202e" not in job
    assert "\\x1b[31m&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;\\u202eevil" in job
    assert HOSTILE_REASON not in job


def test_token_header_cookie_and_headers(jobs: ConsoleJobs, serve: Callable[..., TestClient]) -> None:
    client = serve(TOKEN)
    away = client.get("/console/", follow_redirects=False)
    assert away.status_code == 303 and away.headers["location"] == "/console/login"
    assert client.get("/console/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/console/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    wrong = client.post("/console/login", data={"token": "not-the-token"}, follow_redirects=False)
    assert wrong.status_code == 401 and "Wrong token" in wrong.text and "set-cookie" not in wrong.headers
    ok = client.post("/console/login", data={"token": TOKEN}, follow_redirects=False)
    assert ok.status_code == 303
    cookie = ok.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie  # an HMAC of it
    page = client.get("/console/")  # the client keeps the cookie
    assert page.status_code == 200 and jobs.running in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["content-type"].startswith("text/html")
    assert 'action="/console/logout"' in page.text  # signed in with the cookie: a logout button

    assert client.get("/console/logout").status_code == 405  # never a GET (a link, a prefetch)
    out = client.post("/console/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    cleared = out.headers["set-cookie"]
    assert cleared.startswith(f'{COOKIE}=""') and "Max-Age=0" in cleared and "HttpOnly" in cleared
    away = client.get("/console/", follow_redirects=False)
    assert away.status_code == 303 and away.headers["location"] == "/console/login"
    bearer = client.get("/console/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200 and 'action="/console/logout"' not in bearer.text  # no session


def test_without_a_token_loopback_only(jobs: ConsoleJobs, serve: Callable[..., TestClient]) -> None:
    client = serve(loopback_rule=True)
    assert client.get("/console/").status_code == 200
    rebound = client.get("/console/", headers={"Host": "attacker.example"})
    assert rebound.status_code == 421


def test_partitions_paginate(
    engine: sa.Engine, migrated: DatabaseSettings, serve: Callable[..., TestClient], job_name: str
) -> None:
    start_run(Store(engine, migrated), job_name)
    seed(engine, migrated, job_name, {("t-many", p): p for p in range(250)})
    client = serve()
    one = client.get(f"/console/jobs/{job_name}").text
    assert "1-100 of 250 (page 1 of 3)" in one and "<td>t-many</td>" in one
    three = client.get(f"/console/jobs/{job_name}", params={"page": "3"}).text
    assert "201-250 of 250 (page 3 of 3)" in three and ">249</a>" in three and ">199</a>" not in three
    assert "201-250 of 250" in client.get(f"/console/jobs/{job_name}", params={"page": "99"}).text


def test_dead_letters_counts_and_offsets_never_payloads(
    engine: sa.Engine, migrated: DatabaseSettings, serve: Callable[..., TestClient], job_name: str
) -> None:
    store = Store(engine, migrated)
    start_run(store, job_name)
    rejected = [
        DeadLetter(Record("t-dead", 1, off, b"secret-key", b"secret-payload", None), f"bad record {off}")
        for off in (5, 9, 40)
    ]
    with engine.begin() as conn:
        write_dead_letters(conn, migrated, job_name, rejected)
    page = serve().get(f"/console/jobs/{job_name}").text
    assert "<h2>Dead letters (3)</h2>" in page
    assert '<td>t-dead</td><td>1</td><td class="n">3</td><td class="n">5</td><td class="n">40</td>' in page
    assert "secret" not in page and "bad record" not in page
