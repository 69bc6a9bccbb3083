"""The operator's console: read-only HTML pages of the store served by ``txn-offsets serve`` under
``/console`` (jobs overview, a job's page, lineage search), from the same admin functions as the
CLI and the same snapshot as /metrics. No JavaScript; every stored text escaped; the token (header
or login cookie) as for /offsets."""

from txn_offsets.service.console.history import LagHistory
from txn_offsets.service.console.routes import console_routes

__all__ = ["LagHistory", "console_routes"]
