"""``txn-offsets serve``: parse, then hand over to :func:`txn_offsets.service.server.serve`.

After a stop (SIGTERM/SIGINT) the server has abandoned requests still waiting for PostgreSQL or
Kafka; their worker threads would keep the process alive until their own timeouts end. The
command waits for them for a moment, then ends the process without the interpreter's teardown:
the service is read-only, so nothing is left half-done, and the teardown is not safe here. The
health checks and abandoned requests run in daemon threads whose librdkafka clients can be in
the middle of a call (a Kafka that does not answer); the teardown frees what they use under
them, and a client freed with work in flight crashes the process (see kafka/admins.py). In CI a
stopped service died once of SIGSEGV (exit -11) instead of exiting 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from txn_offsets.cli import options
from txn_offsets.config import database_from_env

__all__ = ["register"]

logger = logging.getLogger(__name__)

LINGER_S = 0.5  # how long a stopped service waits for abandoned requests before exiting anyway


def _exit_stopped(before: set[threading.Thread]) -> None:
    """End the process (code 0) once the requests started while serving are done, or after
    LINGER_S without them, and without the interpreter's teardown (the module's docstring says
    why). In a thread other than the main one (the service embedded in a program) it returns."""
    if threading.current_thread() is not threading.main_thread():
        return
    deadline = time.monotonic() + LINGER_S
    for thread in set(threading.enumerate()) - before:
        if not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
    if left:
        logger.warning("stopped; %d request(s) still waiting for PostgreSQL or Kafka are dropped", len(left))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(args: argparse.Namespace) -> int:
    from txn_offsets.service.server import serve, token_from_env
    from txn_offsets.service.status import StatusRules

    db = database_from_env(schema=args.schema)
    kafka = options.kafka(args)
    token = token_from_env()

    def listening(url: str) -> None:
        auth = "bearer token required for /metrics and /offsets" if token is not None else "no token"
        print(
            f"serving schema {db.schema!r} on {url} (/metrics /offsets /healthz /readyz; {auth})", flush=True
        )

    before = set(threading.enumerate())
    serve(
        db,
        kafka,
        host=args.host,
        port=args.port,
        token=token,
        insecure_no_token=args.insecure_no_token,
        kafka_cache_s=args.kafka_cache_s,
        on_listening=listening,
        rules=StatusRules(args.stall_after_s, args.trend_window_s, args.fenced_hold_s),
    )
    _exit_stopped(before)
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
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1, loopback only; any other address needs "
        "$TXN_OFFSETS_SERVE_TOKEN or --insecure-no-token)",
    )
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow a --host beyond loopback without $TXN_OFFSETS_SERVE_TOKEN: anyone who reaches "
        "the address reads the offsets (e.g. in a container whose port is published on loopback only)",
    )
    serve.add_argument(
        "--port",
        type=options.integer(0, 65535),
        default=9478,
        help="TCP port (default: 9478, clear of postgres_exporter's 9187 and kafka_exporter's 9308; "
        "0 picks a free one)",
    )
    options.add_kafka_bootstrap(serve)
    serve.add_argument(
        "--kafka-cache-s",
        type=options.seconds,
        default=5.0,
        help="seconds Kafka's offsets are cached between scrapes (default: 5)",
    )
    # the job status thresholds (txn_offsets.service.status.StatusRules), seconds > 0
    serve.add_argument(
        "--stall-after-s",
        type=options.positive_seconds,
        default=600.0,
        help="STALLED: a live run's partition with lag has not moved for this long (default: 600)",
    )
    serve.add_argument(
        "--trend-window-s",
        type=options.positive_seconds,
        default=600.0,
        help="LAGGING: the total lag grew over every scrape of this window (default: 600)",
    )
    serve.add_argument(
        "--fenced-hold-s",
        type=options.positive_seconds,
        default=900.0,
        help="FENCED: shown this long after a fencing or conflict was counted (default: 900)",
    )
    serve.set_defaults(handler=_serve)
