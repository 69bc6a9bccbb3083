"""The console's routes: what each page reads (the admin functions the CLI uses, the service's
snapshot and status memory) and who may see it.

* ``/console/``: the jobs overview, from the snapshot /metrics reads (which one:
  :mod:`~txn_offsets.service.console.fresh`), paginated by 50 jobs;
* ``/console/jobs/{job}``: one job, reading that job alone: a page of 100 stored offsets with
  Kafka's facts for them (the service's cached view), its runs, audit history and dead letters;
* ``/console/lineage?job=&topic=&partition=&offset=``: ``offsets explain``'s answer;
* ``/console/login`` (GET: the form, POST: the cookie), ``/console/logout`` (POST only: the
  button every page shows to a visitor who came in with the cookie; it clears the cookie).

Pages read the store in a worker thread, as /offsets does. ``TXN_OFFSETS_SERVE_GRAFANA_URL``
(Grafana's root URL, http or https) turns on the links to the shipped dashboard
(``deploy/grafana/txn-offsets.json``, uid ``txn-offsets``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from txn_offsets.admin import console_views
from txn_offsets.admin.lag import partition_lags
from txn_offsets.admin.lineage import explain
from txn_offsets.admin.views import audit_log
from txn_offsets.errors import ConfigError, TxnOffsetsError, UnknownJob
from txn_offsets.redaction import Secret
from txn_offsets.service.console import pages
from txn_offsets.service.console.auth import HEADERS, ConsoleAuth
from txn_offsets.service.console.fresh import Freshness
from txn_offsets.service.console.history import LagHistory, RememberedStatuses
from txn_offsets.service.console.markup import page, text
from txn_offsets.service.console.paging import Pages, page_number
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.snapshot import Snapshot
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import validate_job

__all__ = ["GRAFANA_ENV", "Console", "console_routes", "grafana_from_env"]

GRAFANA_ENV = "TXN_OFFSETS_SERVE_GRAFANA_URL"
AUDIT_ROWS = 100


def grafana_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """Grafana's root URL from TXN_OFFSETS_SERVE_GRAFANA_URL (unset or empty: no links)."""
    env = os.environ if environ is None else environ
    value = (env.get(GRAFANA_ENV) or "").strip()
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ConfigError(GRAFANA_ENV, f"{value!r}: give Grafana's http(s) URL, e.g. https://grafana.example")
    return value.rstrip("/")


@dataclass
class Console:
    """What the pages read: the store, the Kafka cache, the snapshot (as a scrape reads it), the
    service's status and lag memory, the token's checks, which snapshot the overview shows and
    the Grafana URL."""

    store: Store
    kafka: KafkaView
    snapshot: Callable[[], Snapshot]
    statuses: RememberedStatuses
    history: LagHistory
    auth: ConsoleAuth
    freshness: Freshness
    grafana: str | None = None


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _problem(title: str, message: str, status: int) -> HTMLResponse:
    return _html(page(title, f'<p class="err">{text(message)}</p>', refresh_s=None), status)


def _guarded(
    console: Console, handler: Callable[[Request], Response]
) -> Callable[[Request], Awaitable[Response]]:
    """`handler` for an allowed request, in a worker thread (abandoned by a stopping server)."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        if not console.auth.allowed(request):
            return console.auth.refused(request)
        return await anyio.to_thread.run_sync(handler, request, abandon_on_cancel=True)

    return run


def overview(console: Console, request: Request) -> Response:
    now = console.freshness.current()
    snap, statuses, age = now.snapshot, now.statuses, now.age_s
    if snap.database_error is not None:
        return _problem("Jobs", f"the database could not be read: {snap.database_error}", 503)
    leases = console_views.job_leases(console.store, count=False)  # counted in the snapshot
    views = {j.job: j for j in snap.jobs}
    return _html(
        pages.overview_page(
            pages.Overview(
                leases,
                views,
                statuses,
                {j: console.history.samples(j) for j in views},
                None if snap.kafka is None else snap.kafka.error,
                console.grafana,
                page_number(request.query_params.get("page")),
                age,
                console.auth.signed_in(request),
            )
        )
    )


def job(console: Console, request: Request) -> Response:
    name = request.path_params["job"]
    try:
        validate_job(name)
        (lease,) = console_views.job_leases(console.store, name)
    except UnknownJob:
        return _problem("Unknown job", f"no job {name!r} in this store", 404)
    except ConfigError as exc:
        return _problem("Not a job name", str(exc), 400)
    asked = Pages(lease.partitions or 0, pages.PAGE_PARTITIONS, page_number(request.query_params.get("page")))
    found = console_views.offset_page(console.store, name, offset=asked.offset, limit=asked.size)
    stored = {(r.topic, r.partition): r.offset for r in found.rows}
    lags, kafka_error = {}, None
    if stored:
        facts = console.kafka.facts({k: (v,) for k, v in stored.items()})
        kafka_error = facts.error
        if facts.error is None:
            marks = {k: m for k, m in facts.marks.items() if k in stored}
            own = {k: facts.timestamps.get((k[0], k[1], max(stored[k], lo))) for k, (lo, _e) in marks.items()}
            lags = {(p.topic, p.partition): p for p in partition_lags(stored, {}, marks, own)}
    dead, dead_total = console_views.dead_letter_groups(console.store, name)
    last = console.statuses.last(name)
    return _html(
        pages.job_page(
            pages.JobPage(
                lease,
                None if last is None else last[0],
                found.rows,
                lags,
                found.total,
                console_views.runs_of(console.store, name),
                audit_log(console.store, name, limit=AUDIT_ROWS),
                dead,
                dead_total,
                console.history.samples(name),
                kafka_error,
                console.grafana,
                asked.current,
                console.auth.signed_in(request),
            )
        )
    )


def lineage(console: Console, request: Request) -> Response:
    params = request.query_params
    q = pages.LineageQuery(*(params.get(k, "").strip() for k in ("job", "topic", "partition", "offset")))
    shown = functools.partial(pages.lineage_page, q, logout=console.auth.signed_in(request))
    if not (q.topic and q.partition and q.offset):
        return _html(shown(None, None))
    try:
        partition, offset = int(q.partition), int(q.offset)
        found = explain(console.store, q.job, topic=q.topic, partition=partition, offset=offset)
    except ValueError:
        return _html(shown(None, "give the partition and the offset as whole numbers"), 400)
    except UnknownJob:
        return _html(shown(None, f"no job {q.job!r} in this store"), 404)
    except TxnOffsetsError as exc:
        return _html(shown(None, str(exc)), 400)
    return _html(shown(found, None))


def console_routes(
    store: Store,
    kafka: KafkaView,
    snapshot: Callable[[], Snapshot],
    statuses: RememberedStatuses,
    history: LagHistory,
    *,
    token: Secret | None,
    grafana: str | None = None,
) -> list[Route]:
    freshness = Freshness(snapshot, statuses, history, fresh_s=kafka.ttl_s)
    console = Console(store, kafka, snapshot, statuses, history, ConsoleAuth(token), freshness, grafana)

    def bound(handler: Callable[[Console, Request], Response]) -> Callable[[Request], Awaitable[Response]]:
        return _guarded(console, functools.partial(handler, console))

    async def login(request: Request) -> Response:
        if request.method == "POST":
            return await console.auth.login(request)
        return console.auth.login_page()

    async def logout(_request: Request) -> Response:
        return console.auth.logout()

    async def home(_request: Request) -> Response:
        return RedirectResponse("/console/", status_code=308)

    return [
        Route("/console", home),
        Route("/console/", bound(overview)),
        Route("/console/jobs/{job:path}", bound(job)),
        Route("/console/lineage", bound(lineage)),
        Route("/console/login", login, methods=["GET", "POST"]),
        Route("/console/logout", logout, methods=["POST"]),
    ]
