"""The service's view of its dependencies, refreshed in the background: /healthz and /readyz only
read it, so a probe never waits for PostgreSQL or Kafka and never takes a thread of the pool that
serves /metrics.

Two daemon threads, one per dependency (a Kafka that hangs never makes PostgreSQL look stale),
check every ``interval_s`` (2 s):

* PostgreSQL: ``SELECT version_num FROM <schema>.alembic_version`` on a one-connection engine of
  its own (connect 2 s, statement 2 s, TCP user timeout 3 s); the revision read is compared with
  the one this version expects;
* Kafka: one DescribeCluster request (``timeout_s``, 1.5 s) on the process's shared AdminClient.

A dependency is ``ok`` when its last check succeeded and that success is at most
``stale_after_s`` (3 intervals) old: before its first check, after a failed one, or while a check
is stuck it is ``unavailable``.

* **liveness** (/healthz): both threads are alive and each finished a check, whatever its
  outcome, within ``wedged_after_s`` (30 s; every check is bounded well below that). A dependency
  that is down does not fail liveness: restarting the service would not bring it back.
* **readiness** (/readyz): PostgreSQL ok, the schema at the expected revision, Kafka ok.

Probe bodies say only ok/unavailable per dependency; :meth:`HealthMonitor.probe` adds the details
(redacted URL, bootstrap servers, last error class, ages of the last check and last success) only
when asked, for a caller that showed the token.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import SchemaMissing, ServiceUnavailable, TxnOffsetsError
from txn_offsets.store.handle import Store

__all__ = ["DEPENDENCIES", "HealthMonitor"]

logger = logging.getLogger(__name__)

DEPENDENCIES = ("postgres", "kafka")
Check = Callable[[], str | None]  # raises when the dependency cannot be used; returns a value


@dataclass
class _State:
    started_at: float
    checked_at: float | None = None  # monotonic end of the last finished check
    ok_at: float | None = None  # monotonic end of the last successful one
    ok: bool = False  # the outcome of the last finished check
    error: str | None = None  # its error class, when it failed
    said: str | None = None  # what our error said (unreachable: why, if librdkafka told), else the class
    value: str | None = None  # what it read (PostgreSQL: the schema's revision)


def _error_class(exc: BaseException) -> str:
    code = exc.args[0] if exc.args else None
    name = getattr(code, "name", None)  # a KafkaError: its code name (_TRANSPORT, _TIMED_OUT...)
    return f"{type(exc).__name__}({name()})" if callable(name) else type(exc).__name__


def _said(exc: BaseException) -> str:
    """A failed check in one line: our error's (an unreachable service: its detail, which names
    librdkafka's cause when it gave one), else the class."""
    if isinstance(exc, ServiceUnavailable):
        return exc.detail
    return str(exc) if isinstance(exc, TxnOffsetsError) else _error_class(exc)


def _postgres_check(store: Store) -> str | None:

    version = sa.table("alembic_version", sa.column("version_num"), schema=store.schema)
    with store.connect() as conn:
        try:
            with store.errors():
                revision = conn.execute(sa.select(version.c.version_num)).scalar_one_or_none()
        except SchemaMissing:
            return None  # reachable; the schema is not there (readiness: mismatch)
    return None if revision is None else str(revision)


def _kafka_check(kafka: KafkaSettings, timeout_s: float) -> None:
    from confluent_kafka import KafkaException

    from txn_offsets.kafka import admins

    try:
        admin = admins.admin_client(kafka)
        fut = admin.describe_cluster(request_timeout=timeout_s)
        admins.issued(admin, [fut])
        fut.result(timeout=timeout_s + 1.0)
    except (KafkaException, TimeoutError) as exc:  # a fresh client next time, and why, if librdkafka said
        said = (
            admins.describe_error(exc) if isinstance(exc, KafkaException) else f"no answer in {timeout_s:g}s"
        )
        raise admins.unreachable(kafka, "metadata", timeout_s + 2.0, said) from None
    except Exception:
        admins.forget_admin_client(kafka)  # a fresh client next time, not one retrying forever
        raise


class HealthMonitor:
    """Background checks of PostgreSQL and Kafka; thread-safe reads for the probes.

    `checks` replaces the real checks (name -> callable raising on failure), for tests."""

    def __init__(
        self,
        db: DatabaseSettings,
        kafka: KafkaSettings,
        *,
        interval_s: float = 2.0,
        timeout_s: float = 1.5,
        stale_intervals: int = 3,
        wedged_after_s: float = 30.0,
        checks: Mapping[str, Check] | None = None,
        expected_revision: str | None = None,
    ) -> None:
        self.db = db
        self.kafka = kafka
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_intervals * interval_s
        self.wedged_after_s = max(wedged_after_s, 2 * self.stale_after_s)
        self._checks = dict(checks) if checks is not None else None
        self._expected = expected_revision
        self._engine: sa.Engine | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        now = time.monotonic()
        self._states = {name: _State(now) for name in DEPENDENCIES}

    # -- running --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the checks (once; later calls do nothing)."""
        with self._lock:
            if self._threads:
                return
            checks = self._checks if self._checks is not None else self._real_checks()
            now = time.monotonic()
            for name in DEPENDENCIES:
                self._states[name] = _State(now)
                thread = threading.Thread(
                    target=self._loop,
                    args=(name, checks[name]),
                    name=f"txn-offsets-health-{name}",
                    daemon=True,
                )
                self._threads.append(thread)
            for thread in self._threads:
                thread.start()

    def _real_checks(self) -> dict[str, Check]:
        from txn_offsets.store.migrate import head

        if self._expected is None:
            self._expected = head()
        short = dataclasses.replace(
            self.db,
            connect_timeout_s=2.0,  # libpq's minimum
            statement_timeout_s=2.0,
            lock_timeout_s=1.0,
            idle_in_transaction_timeout_s=5.0,
            tcp_user_timeout_s=3.0,
        )
        store = Store.of(short, pool_size=1, max_overflow=0, pool_timeout=2)
        self._engine = store.engine

        def kafka() -> str | None:
            _kafka_check(self.kafka, self.timeout_s)
            return None

        return {"postgres": lambda: _postgres_check(store), "kafka": kafka}

    def stop(self) -> None:
        """Stop the checks (a check under way is not waited for beyond a moment)."""
        self._stop.set()
        deadline = time.monotonic() + 0.2  # the threads are daemons: a stuck check is left behind
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._engine is not None:
            self._engine.dispose()

    def _loop(self, name: str, check: Check) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            said: str | None = None
            try:
                value, error = check(), None
            except Exception as exc:  # any failure is "unavailable", and the checks go on
                value, error = None, _error_class(exc)
                said = _said(exc)
            self._record(name, value, error, said)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _record(self, name: str, value: str | None, error: str | None, said: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            state = self._states[name]
            was_ok, first = state.ok, state.checked_at is None
            state.checked_at, state.ok, state.error, state.value = now, error is None, error, value
            state.said = said
            if error is None:
                state.ok_at = now
        if error is not None and (was_ok or first):
            logger.warning("health: %s unavailable (%s)", name, said or error)
        elif error is None and not was_ok and not first:
            logger.warning("health: %s available again", name)

    # -- reading --------------------------------------------------------------------------------

    def _ok(self, state: _State, now: float) -> bool:
        return state.ok and state.ok_at is not None and now - state.ok_at <= self.stale_after_s

    def checked(self) -> bool:
        """Every dependency has been checked at least once since :meth:`start`."""
        with self._lock:
            return all(s.checked_at is not None for s in self._states.values())

    def kafka_down(self) -> str | None:
        """Why Kafka's last check failed - our one line (naming librdkafka's cause when it gave
        one), else the error class - None: ok, or not checked yet."""
        with self._lock:
            state = self._states["kafka"]
            return (state.said or state.error) if state.checked_at is not None and not state.ok else None

    def live(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if not self._threads or self._stop.is_set():
                return False
            return all(t.is_alive() for t in self._threads) and all(
                now - (s.checked_at if s.checked_at is not None else s.started_at) <= self.wedged_after_s
                for s in self._states.values()
            )

    def probe(
        self, kind: Literal["live", "ready"], *, details: bool = False
    ) -> tuple[int, dict[str, object]]:
        """(HTTP status, body) of /healthz (`live`) or /readyz (`ready`)."""
        live = self.live()
        now = time.monotonic()
        with self._lock:
            states = {name: dataclasses.replace(s) for name, s in self._states.items()}
        ok = {name: self._ok(s, now) for name, s in states.items()}
        body: dict[str, object] = {"status": "ok"}
        body.update({name: "ok" if ok[name] else "unavailable" for name in DEPENDENCIES})
        if kind == "live":
            passed = live
        else:
            revision = states["postgres"].value
            schema = (
                "unavailable" if not ok["postgres"] else "ok" if revision == self._expected else "mismatch"
            )
            body["schema"] = schema
            passed = live and all(ok.values()) and schema == "ok"
        body["status"] = "ok" if passed else "unavailable"
        if details:
            body["details"] = self._details(states, now)
        return (200 if passed else 503), body

    def _details(self, states: dict[str, _State], now: float) -> dict[str, object]:
        def age(at: float | None) -> float | None:
            return None if at is None else round(now - at, 3)

        pg, kafka = states["postgres"], states["kafka"]
        out: dict[str, object] = {
            "postgres": {
                "url": self.db.display_url,
                "schema": self.db.schema,
                "revision": pg.value,
                "expected_revision": self._expected,
                "error": pg.error,
                "checked_age_s": age(pg.checked_at),
                "ok_age_s": age(pg.ok_at),
            },
            "kafka": {
                "bootstrap": self.kafka.bootstrap_servers,
                "error": kafka.error,
                "checked_age_s": age(kafka.checked_at),
                "ok_age_s": age(kafka.ok_at),
            },
        }
        out["interval_s"] = self.interval_s
        out["stale_after_s"] = self.stale_after_s
        return out
