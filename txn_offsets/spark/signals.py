"""Stopping a run between batches on SIGTERM/SIGINT (a deploy, Ctrl-C): the batch in flight
finishes or fails as a whole; the next run plans from the stored offsets."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["stop_on_signals"]

logger = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event) -> Any:
    """Stop between batches on SIGTERM/SIGINT (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s: stopping after the current batch", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
