"""The root error, the two families by base class, and ConfigError.

* :class:`TxnOffsetsError` - every error of the library; its ``outcome`` (a class attribute) is
  the name under which a Spark task reports it to the driver instead of raising it (a retry of the
  task could never change it) and under which ``job_stats`` counts it.
* :class:`Transient` - failures after which planning again from the stored offsets may succeed:
  ``run_job`` retries them (``retries``, ``retry_backoff_s``); everything else ends the run.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["ConfigError", "Transient", "TxnOffsetsError"]


class TxnOffsetsError(Exception):
    """Root of every error raised by txn_offsets."""

    __module__ = "txn_offsets"
    # what a range's task reports instead of raising (None: it raises); job_stats' outcome name
    outcome: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # every error shows (and pickles) under its public path: txn_offsets.OffsetConflict
        super().__init_subclass__(**kwargs)
        cls.__module__ = "txn_offsets"

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (Spark tasks -> driver). The default pickling calls
        # cls(*args) with the message only, which our keyword-rich constructors reject.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls: type[TxnOffsetsError], args: tuple[Any, ...], state: dict[str, Any]) -> TxnOffsetsError:
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class Transient(TxnOffsetsError):
    """A failure that planning again from the stored offsets may get past (retried by ``run_job``):
    nothing of the failed ranges was committed, and the next plan sees the world as it is then."""


class ConfigError(TxnOffsetsError, ValueError):
    """A setting is missing or invalid; the message names the setting and what to use instead."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(f"{setting}: {problem}")
