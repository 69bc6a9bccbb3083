"""What a run's streaming query is in either mode (``open_stream``'s micro-batches,
``open_realtime``'s real-time mode): its checkpoint's place, its start (logged with the run and
the checkpoint) and its end - the query stopped if it runs, then the run's lifecycle closed (the
lease released, the engine disposed), once, whatever the stop raised."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import urllib.parse
from types import TracebackType
from typing import Any, Self

from txn_offsets.store.runs import Run

__all__ = ["RunQuery", "run_checkpoint"]

logger = logging.getLogger(__name__)


def run_checkpoint(root: str, schema: str, run: Run) -> str:
    """The checkpoint of one run of a stream: ``<root>/<schema>/<job>/generation-<g>-<run digest>``."""
    job = urllib.parse.quote(run.job, safe="")
    digest = hashlib.sha256(run.run_id.encode()).hexdigest()[:12]
    return f"{root}/{schema}/{job}/generation-{run.generation}-{digest}"


class RunQuery:
    """The shared part of TxnStream and RealTimeStream (their ``__init__`` sets the three fields)."""

    query: Any
    _closed: bool
    _lifecycle: contextlib.ExitStack

    def _launch(self, writer: Any, run: Run, what: str, checkpoint: str) -> Any:
        logger.info(
            "job=%r generation=%d: starting the %s, checkpoint %s", run.job, run.generation, what, checkpoint
        )
        self.query = writer.start()
        return self.query

    def _forget(self) -> None:
        """What else closing ends, before the run itself (nothing here)."""

    def close(self) -> None:
        """Stop the query (if running) and release the run's lease."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.query is not None and self.query.isActive:
                self.query.stop()
        finally:
            try:
                self._forget()
            finally:
                self._lifecycle.close()  # releases the lease (quietly) and closes the engine

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
