"""The HTTP app of ``txn-offsets serve`` (Starlette, served by uvicorn): read-only views of the store.

* ``/metrics``: Prometheus exposition by prometheus-client (text or OpenMetrics, as the scraper asks)
* ``/offsets``: JSON, every job (``/offsets/{job}``: one job; unknown job: 404)
* ``/healthz``: 200 when PostgreSQL and Kafka answer, else 503 naming which one does not
* ``/readyz``: 200 when the offsets schema is at the revision this version expects, else 503

With a token (``TXN_OFFSETS_SERVE_TOKEN``) ``/metrics`` and ``/offsets`` need
``Authorization: Bearer <token>``; the probes stay open (they show no offsets). Handlers are plain
functions: Starlette runs them in its thread pool, so a slow database never blocks the event loop.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from txn_offsets.config import DatabaseSettings, Secret
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.service.collector import StoreCollector
from txn_offsets.service.kafka_view import KafkaView
from txn_offsets.service.snapshot import Snapshot, read_snapshot
from txn_offsets.store.database import translate_errors
from txn_offsets.store.runs import validate_job

__all__ = ["Service", "create_app"]

logger = logging.getLogger(__name__)


@dataclass
class Service:
    """What the handlers share: the engine (short timeouts), the settings and the Kafka cache."""

    engine: sa.Engine
    db: DatabaseSettings
    kafka: KafkaView
    token: Secret | None = None

    def snapshot(self) -> Snapshot:
        return read_snapshot(self.engine, self.db, self.kafka)


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


def _revision(service: Service) -> str | None:
    from txn_offsets.store.migrate import head

    version = sa.table("alembic_version", sa.column("version_num"), schema=service.db.schema)
    with translate_errors(service.db), service.engine.connect() as conn:
        current = conn.execute(sa.select(version.c.version_num)).scalar_one_or_none()
    expected = head()
    return (
        None if current == expected else f"schema {service.db.schema!r} is at {current}, expected {expected}"
    )


def create_app(service: Service) -> Starlette:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(service.snapshot, lambda: service.kafka.refreshes))

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
        jobs = [j.as_dict() for j in snap.jobs if wanted is None or j.job == wanted]
        if wanted is not None and not jobs:
            return _error(404, f"unknown job {wanted!r} (see /offsets for the jobs of this store)")
        kafka = snap.kafka
        return JSONResponse(
            {
                "schema": service.db.schema,
                "isolation_level": service.kafka.kafka.isolation_level,
                "kafka_error": None if kafka is None else kafka.error,
                "kafka_facts_at": None if kafka is None else kafka.fetched_at,
                "jobs": jobs if wanted is None else jobs[0],
            }
        )

    def healthz(_request: Request) -> Response:
        problems = {}
        try:
            with translate_errors(service.db), service.engine.connect() as conn:
                conn.execute(sa.select(sa.literal(1)))
        except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
            problems["database"] = str(exc) if isinstance(exc, TxnOffsetsError) else type(exc).__name__
        kafka_problem = service.kafka.ping()
        if kafka_problem is not None:
            problems["kafka"] = kafka_problem
        body = {"database": problems.get("database", "ok"), "kafka": problems.get("kafka", "ok")}
        return JSONResponse(body, status_code=503 if problems else 200)

    def readyz(_request: Request) -> Response:
        try:
            problem = _revision(service)
        except (TxnOffsetsError, sa.exc.SQLAlchemyError) as exc:
            problem = str(exc) if isinstance(exc, TxnOffsetsError) else type(exc).__name__
        if problem is not None:
            return JSONResponse({"ready": False, "reason": problem}, status_code=503)
        return JSONResponse({"ready": True})

    routes = [
        Route("/metrics", metrics),
        Route("/offsets", offsets),
        Route("/offsets/{job:path}", offsets),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
    ]
    return Starlette(routes=routes)
