"""Options and setup that several command groups share.

The database URL is read only from TXN_OFFSETS_DATABASE_URL, never from an argument: command
lines end up in shell histories and process lists, and the URL holds the password.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from txn_offsets.admin.moves import MAX_OFFSET
from txn_offsets.cli import exits, output
from txn_offsets.config import DatabaseSettings, KafkaSettings, database_from_env, kafka_from_env
from txn_offsets.store.handle import Store

__all__ = [
    "BIGINT_MAX",
    "INT_MAX",
    "add_format",
    "add_kafka_bootstrap",
    "aware_datetime",
    "database",
    "duration",
    "integer",
    "kafka",
    "opened",
    "positive_seconds",
    "require_reason",
    "seconds",
    "store_options",
]

#: The largest value of PostgreSQL's bigint (offsets) and integer (partitions) columns.
BIGINT_MAX = MAX_OFFSET
INT_MAX = 2**31 - 1


def integer(low: int | None = 0, high: int | None = BIGINT_MAX) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [low, high], else a usage error naming the bounds."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}")
        return value

    return parse


def aware_datetime(text: str) -> datetime:
    """An argparse ``type``: an ISO 8601 datetime with its timezone (``2024-05-01T12:00:00Z``)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 datetime (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone: give one, e.g. 2024-05-01T12:00:00Z or ...+02:00"
        )
    return value


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


MAX_DURATION_S = 100 * 365 * 86400  # PostgreSQL's intervals hold more; no retention needs more
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """An argparse ``type``: a duration > 0 with its unit (s, m, h, d, w: ``30d``), in seconds."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        value = float(number) * _UNITS[unit] if unit in _UNITS and number else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration > 0 with a unit (e.g. 30d, 12h, 90m, 3600s)"
        )
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than 100 years")
    return value


def require_reason(args: argparse.Namespace, why: str) -> None:
    """A usage error (code 64) unless ``--reason`` has some text: it is written to the audit table
    (`why`: what the reason is to explain, e.g. "the offsets move")."""
    if not (args.reason and args.reason.strip()):
        raise exits.UsageError("--reason", f"say why {why} (it is written to the audit table)")


def store_options() -> argparse.ArgumentParser:
    """The parent parser of every command that works on the offset store (``--schema``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--schema",
        default=os.environ.get("TXN_OFFSETS_SCHEMA", "txn_offsets"),
        help="Postgres schema of the txn_offsets tables (default: $TXN_OFFSETS_SCHEMA or txn_offsets); "
        "the database URL is read from $TXN_OFFSETS_DATABASE_URL only",
    )
    return common


def add_format(parser: argparse.ArgumentParser) -> None:
    """``--format table|json``; also accepted before the command (``txn-offsets --format json ...``),
    so its default is set by :func:`txn_offsets.cli.main.main` once both sides are parsed."""
    parser.add_argument(
        "--format",
        choices=output.FORMATS,
        default=argparse.SUPPRESS,
        help="table (default) or json (for scripts)",
    )
    parser.set_defaults(takes_format=True)


def add_kafka_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-bootstrap",
        default=None,
        help="Kafka bootstrap servers (default: the --kafka-config file's bootstrap.servers, else "
        "$TXN_OFFSETS_KAFKA_BOOTSTRAP)",
    )
    parser.add_argument(
        "--kafka-config",
        metavar="FILE",
        default=None,
        help="Kafka client properties, key=value lines (security.protocol, sasl.mechanism, "
        "sasl.username, sasl.password, ssl.ca.location, ...), as kafka-consumer-groups.sh's "
        "--command-config (default: $TXN_OFFSETS_KAFKA_CONFIG)",
    )


def database(args: argparse.Namespace) -> DatabaseSettings:
    return database_from_env(schema=args.schema)


def kafka(args: argparse.Namespace) -> KafkaSettings:
    """Kafka settings from --kafka-bootstrap / --kafka-config and the environment."""
    return kafka_from_env(bootstrap=args.kafka_bootstrap, config_file=args.kafka_config)


@contextmanager
def opened(db: DatabaseSettings) -> Iterator[Store]:
    """The store of one command, on an engine of its own disposed of when it is done."""
    store = Store.of(db)
    try:
        yield store
    finally:
        store.engine.dispose()
