"""``txn-offsets serve``: parse, then hand over to :func:`txn_offsets.service.server.serve`."""

from __future__ import annotations

import argparse
import os

from txn_offsets.config import database_from_env, kafka_from_env
from txn_offsets.errors import ConfigError

__all__ = ["register"]


def _serve(args: argparse.Namespace) -> int:
    from txn_offsets.service.server import serve, token_from_env

    if not args.kafka_cache_s >= 0:
        raise ConfigError("--kafka-cache-s", f"{args.kafka_cache_s}: give a number of seconds >= 0")
    db = database_from_env(schema=args.schema)
    kafka = kafka_from_env(bootstrap=args.kafka_bootstrap)
    token = token_from_env()

    def listening(url: str) -> None:
        auth = "bearer token required for /metrics and /offsets" if token is not None else "no token"
        print(
            f"serving schema {db.schema!r} on {url} (/metrics /offsets /healthz /readyz; {auth})", flush=True
        )

    serve(
        db,
        kafka,
        host=args.host,
        port=args.port,
        token=token,
        kafka_cache_s=args.kafka_cache_s,
        on_listening=listening,
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="read-only HTTP service: /metrics (Prometheus), /offsets (JSON), /healthz, /readyz",
        description="Serve the offset store's metrics and offsets. The database URL comes from "
        "$TXN_OFFSETS_DATABASE_URL, an optional bearer token from $TXN_OFFSETS_SERVE_TOKEN.",
    )
    serve.add_argument(
        "--schema",
        default=os.environ.get("TXN_OFFSETS_SCHEMA", "txn_offsets"),
        help="Postgres schema of the txn_offsets tables (default: $TXN_OFFSETS_SCHEMA or txn_offsets)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)"
    )
    serve.add_argument(
        "--port",
        type=int,
        default=9478,
        help="TCP port (default: 9478, clear of postgres_exporter's 9187 and kafka_exporter's 9308; "
        "0 picks a free one)",
    )
    serve.add_argument(
        "--kafka-bootstrap",
        default=None,
        help="Kafka bootstrap servers (default: $TXN_OFFSETS_KAFKA_BOOTSTRAP)",
    )
    serve.add_argument(
        "--kafka-cache-s",
        type=float,
        default=5.0,
        help="seconds Kafka's offsets are cached between scrapes (default: 5)",
    )
    serve.set_defaults(handler=_serve)
