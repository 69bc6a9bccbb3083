"""The HTTP app of ``txn-offsets serve`` (Starlette, served by uvicorn): read-only views of the store.

* ``/metrics``: Prometheus exposition by prometheus-client (text or OpenMetrics, as the scraper asks)
* ``/offsets``: JSON, every job with its status under ``jobs`` (``/offsets/{job}``: that job's
  object itself; unknown or retired job: 404); retired jobs are only named (``retired_jobs``), as
  they give no series in /metrics
* ``/healthz``: liveness, ``/readyz``: readiness, both from the background checks of
  :class:`~txn_offsets.service.health.HealthMonitor` (what each means is documented there)
* ``/console/``: the operator's console, HTML pages over the same data
  (:mod:`txn_offsets.service.console`); the token as a header or the login form's cookie

With a token (``TXN_OFFSETS_SERVE_TOKEN``) ``/metrics`` and ``/offsets`` need
``Authorization: Bearer <token>``. The probes stay open but say only ok/unavailable per
dependency; the details (redacted URL, bootstrap servers, last error class, ages) are added for a
request that shows the token, and never when no token is set.

The probes are coroutines that read the cached health: they run on the event loop, never wait for
PostgreSQL or Kafka and never take a worker thread. /metrics and /offsets read the store in a
worker thread (a slow database never blocks the event loop) that a stopping server abandons
instead of waiting for it.

Without a token, ``serve`` wraps the app in :class:`LoopbackHostsOnly`: a service on loopback is
reachable from every web page the machine's browser opens, and DNS rebinding (a name the page's
site controls pointed at 127.0.0.1) lets such a page read the answers, its Host header still naming
the attacker's site. So without a token only requests addressed to a loopback name (``localhost``,
127.0.0.0/8, ``[::1]``, any port) are answered; others get 421 with a body that says why. The
probes stay open to any name: they say only ok/unavailable, and an orchestrator asks them by the
pod's address. With a token any Host is answered: the token guards the data, and scrapers reach the
service under names of their own.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import anyio.to_thread
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from txn_offsets.errors import TxnOffsetsError
from txn_offsets.redaction import Secret
from txn_offsets.service.collector import StoreCollector
from txn_offsets.service.console import LagHistory, console_routes
from txn_offsets.service.console.history import RememberedStatuses
from txn_offsets.service.health import HealthMonitor
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.snapshot import Snapshot, read_snapshot
from txn_offsets.service.status import StatusRules
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import validate_job

__all__ = ["OPEN_PATHS", "LoopbackHostsOnly", "Service", "create_app", "is_loopback", "loopback_host"]

logger = logging.getLogger(__name__)


@dataclass
class Service:
    """What the handlers share: the store (an engine with short timeouts), the Kafka cache, the
    health checks (made from the settings when not given; started by :func:`create_app`), the
    thresholds of the job status, the consumer group each job is shown as (job -> group; a job
    not listed is its own group), the lag history every snapshot feeds (the console's charts) and
    Grafana's URL for the console's links (None: none)."""

    store: Store
    kafka: KafkaView
    token: Secret | None = None
    health: HealthMonitor | None = None
    rules: StatusRules = field(default_factory=StatusRules)
    groups: Mapping[str, str] = field(default_factory=dict)
    history: LagHistory = field(default_factory=LagHistory)
    grafana: str | None = None

    def snapshot(self) -> Snapshot:
        snap = read_snapshot(self.store, self.kafka)
        self.history.record(snap)
        return snap

    def start(self) -> HealthMonitor:
        """Start the health checks (once) and let a scrape skip Kafka while its check fails."""
        if self.health is None:
            self.health = HealthMonitor(self.store.settings, self.kafka.kafka)
        self.health.start()
        self.kafka.known_down = self.health.kafka_down
        return self.health

    def close(self) -> None:
        """Stop the health checks (the engine is the caller's)."""
        if self.health is not None:
            self.health.stop()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _authorised(service: Service, request: Request) -> bool:
    if service.token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), service.token.get().encode()
    )


def _denied() -> Response:
    return JSONResponse(
        {"error": "missing or wrong bearer token: send Authorization: Bearer <TXN_OFFSETS_SERVE_TOKEN>"},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _in_thread(handler: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
    """`handler` in a worker thread; a cancelled request (a server stopping) stops waiting for it."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        return await anyio.to_thread.run_sync(handler, request, abandon_on_cancel=True)

    return run


def create_app(service: Service) -> Starlette:
    health = service.start()
    # one memory of the statuses for /metrics, /offsets and the console (FENCED and LAGGING are
    # decided from what earlier snapshots saw)
    statuses = RememberedStatuses(service.rules)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        StoreCollector(
            service.snapshot, lambda: service.kafka.refreshes, statuses=statuses, groups=service.groups
        )
    )

    def metrics(request: Request) -> Response:
        if not _authorised(service, request):
            return _denied()
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    def offsets(request: Request) -> Response:
        if not _authorised(service, request):
            return _denied()
        wanted = request.path_params.get("job")
        if wanted is not None:
            try:
                validate_job(wanted)
            except TxnOffsetsError as exc:
                return _error(400, str(exc))
        snap = service.snapshot()
        if snap.database_error is not None:
            return _error(503, snap.database_error)
        status = statuses.observe(snap)
        jobs = [
            {**j.as_dict(), "status": status.get(j.job)}
            for j in snap.jobs
            if wanted is None or j.job == wanted
        ]
        if wanted is not None and not jobs:
            retired = f"job {wanted!r} is retired (`txn-offsets jobs list --all`); a new run brings it back"
            unknown = f"unknown job {wanted!r} (see /offsets for the jobs of this store)"
            return _error(404, retired if wanted in snap.retired else unknown)
        kafka = snap.kafka
        view = {
            "schema": service.store.schema,
            "isolation_level": service.kafka.kafka.isolation_level,
            "kafka_error": None if kafka is None else kafka.error,
            "kafka_facts_at": None if kafka is None else kafka.fetched_at,
        }
        if wanted is not None:  # one resource: the job's own object, with what it was seen through
            return JSONResponse({**jobs[0], **view})
        return JSONResponse({**view, "jobs": jobs, "retired_jobs": list(snap.retired)})

    def probe(kind: Literal["live", "ready"]) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            details = service.token is not None and _authorised(service, request)
            status, body = health.probe(kind, details=details)
            return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})

        return answer

    routes = [
        Route("/metrics", _in_thread(metrics)),
        Route("/offsets", _in_thread(offsets)),
        Route("/offsets/{job:path}", _in_thread(offsets)),
        Route("/healthz", probe("live")),
        Route("/readyz", probe("ready")),
        *console_routes(
            service.store,
            service.kafka,
            service.snapshot,
            statuses,
            service.history,
            token=service.token,
            grafana=service.grafana,
        ),
    ]
    return Starlette(routes=routes)


OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # ok/unavailable only: nothing a page could use

_REFUSED = (
    "this service answers only requests addressed to localhost, 127.0.0.1 or [::1] while "
    "TXN_OFFSETS_SERVE_TOKEN is not set: the Host header names another host, as a web page "
    "reaching the service through DNS rebinding does. Use one of those names, or set the token"
)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) and ``localhost``; anything else (0.0.0.0, ::, a name,
    an empty host) reaches beyond this machine, or may."""
    host = host.strip().removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def loopback_host(header: str | None) -> bool:
    """Whether a Host header names this machine's loopback: ``localhost``, an address of
    127.0.0.0/8 or ``[::1]`` (IPv6 in brackets), each with or without a port. Strict: anything
    else, a malformed value or no header at all is not."""
    if not header:
        return False
    if header.startswith("["):
        name, bracket, port = header[1:].partition("]")
        if not bracket or ":" not in name:  # only IPv6 goes in brackets
            return False
    else:
        name, colon, digits = header.partition(":")
        port = colon + digits
        if "[" in name or "]" in name:
            return False
    digits = port.removeprefix(":")
    if port and not (port != digits and 1 <= len(digits) <= 5 and digits.isascii() and digits.isdigit()):
        return False
    if "%" in name or name != name.strip():  # an IPv6 zone, padding: never in a browser's Host
        return False
    return is_loopback(name)


class LoopbackHostsOnly:
    """ASGI middleware: 421 for a request whose Host header is not loopback (or missing, or given
    twice), except on :data:`OPEN_PATHS`. Used when no token is set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            hosts = [value for name, value in scope["headers"] if name == b"host"]
            if len(hosts) != 1 or not loopback_host(hosts[0].decode("latin-1")):
                # the header is not echoed: it is the caller's text
                await JSONResponse({"error": _REFUSED}, status_code=421)(scope, receive, send)
                return
        await self.app(scope, receive, send)
