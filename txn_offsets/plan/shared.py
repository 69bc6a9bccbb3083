"""Asks of many threads served together, the way a database's group commit gathers commits: the
jobs of ``run_jobs`` share their plans (:class:`SharedPlans`) and their starts.

``run_jobs`` runs dozens of ``run_job`` loops on threads of one process; each starts its run and
plans before every batch, and they do so at the same moments (at the start, after a shared round).
:class:`SharedAsks` makes the asks that come at the same time with one call: the first thread to
ask serves itself and every thread that asks while it does, then hands the next call to the first
of those that came meanwhile. Nobody waits for a window to fill: an ask made alone is served
alone. Asks are grouped by a key (the database and Kafka cluster they go to); each group is one
call of `make`, whose answer for an ask may be None: the asker then does the work on its own, as
every asker of a group does when `make` raises (the error then stays with the asker it belongs to,
if it is one asker's at all).

:class:`SharedPlans` serves plans so (:func:`~txn_offsets.plan.planner.plan_jobs`: one Kafka
request and one statement or transaction for the plans asked at the same time): a shared plan is
the plan ``plan_batch`` makes for that run, or None where the job plans alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from txn_offsets.config import KafkaSettings
from txn_offsets.plan.planner import Plan, PlanRequest, plan_jobs
from txn_offsets.store.handle import Store

__all__ = ["SharedAsks", "SharedPlans"]

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
Q = TypeVar("Q")
R = TypeVar("R")


@dataclass(eq=False)
class _Ask(Generic[K, Q, R]):
    key: K
    request: Q
    served: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # this thread makes the next call
    answer: R | None = None


class SharedAsks(Generic[K, Q, R]):
    """Asks made at the same time, made together by `make` (see the module's docstring)."""

    def __init__(self, what: str, make: Callable[[K, list[Q]], Sequence[R | None]]) -> None:
        self.what = what  # for the log line of a failed call
        self.asked = 0  # asks
        self.calls = 0  # make calls that served them
        self._make_group = make
        self._lock = threading.Lock()
        self._pending: list[_Ask[K, Q, R]] = []
        self._busy = False

    def ask(self, key: K, request: Q) -> R | None:
        """`request`'s answer, made together with the others asked meanwhile; None: do it alone."""
        ask: _Ask[K, Q, R] = _Ask(key, request)
        with self._lock:
            self.asked += 1
            self._pending.append(ask)
            if not self._busy:
                self._busy = ask.lead = True
        if not ask.lead:
            ask.served.wait()  # served by a leader, or made the next one
        if ask.lead:
            self._lead()
        return ask.answer

    def _lead(self) -> None:
        with self._lock:
            gathered, self._pending = self._pending, []
        try:
            self._make(gathered)
        finally:
            with self._lock:
                if self._pending:  # asked while these were made: the first of them leads next
                    self._pending[0].lead = True
                    self._pending[0].served.set()
                else:
                    self._busy = False
            for ask in gathered:
                ask.lead = False
                ask.served.set()

    def _make(self, gathered: list[_Ask[K, Q, R]]) -> None:
        groups: dict[K, list[_Ask[K, Q, R]]] = {}
        for ask in gathered:
            groups.setdefault(ask.key, []).append(ask)
        for key, asks in groups.items():
            self.calls += 1
            try:
                answers = self._make_group(key, [a.request for a in asks])
            except Exception as exc:  # each asker does it alone and meets its own error, if any
                logger.info(
                    "shared %s of %d job(s) failed (%s): each goes alone",
                    self.what,
                    len(asks),
                    type(exc).__name__,
                )
                continue
            for ask, answer in zip(asks, answers, strict=True):
                ask.answer = answer


class SharedPlans(SharedAsks[tuple[Store, KafkaSettings], PlanRequest, Plan]):
    """Plans asked for at the same time, made together (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__("plan", lambda key, requests: plan_jobs(*key, requests))

    @property
    def plans(self) -> int:
        """Plans asked for."""
        return self.asked

    def plan(self, store: Store, kafka: KafkaSettings, request: PlanRequest) -> Plan | None:
        """`request`'s plan made together with the others asked for meanwhile; None: plan alone."""
        return self.ask((store, kafka), request)
