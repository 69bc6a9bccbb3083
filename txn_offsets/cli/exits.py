"""The exit codes of ``txn-offsets`` (documented in docs/store.md, "Exit codes").

Distinct codes let a script tell "the command line is wrong" from "the command failed" from "the
check ran and the answer is no", without parsing messages.
"""

from __future__ import annotations

__all__ = ["ERROR", "NOT_OK", "OK", "USAGE"]

#: Done.
OK = 0
#: The command ran and failed: the one-line error says what to fix (the library's own errors).
ERROR = 1
#: The command ran and its check said no: `offsets lag --fail-over N` over N, `dev status` with a
#: service down.
NOT_OK = 3
#: The command line itself is wrong: unknown command or option, a missing or malformed argument, a
#: number out of range (BSD sysexits' EX_USAGE; argparse's own 2 is not used).
USAGE = 64
