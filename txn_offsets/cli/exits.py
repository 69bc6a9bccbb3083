"""The exit codes of ``txn-offsets`` (documented in docs/store.md, "Exit codes"), and the error a
command raises for a wrong command line found after parsing (code 64, like argparse's own).

Distinct codes let a script tell "the command line is wrong" from "the command failed" from "the
check ran and the answer is no", without parsing messages.
"""

from __future__ import annotations

from txn_offsets.errors import ConfigError

__all__ = ["CLOSED_PIPE", "ERROR", "INTERRUPTED", "NOT_OK", "OK", "USAGE", "UsageError"]

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
#: Interrupted (Ctrl-C, SIGINT): 128 + 2, what a shell reports for a command SIGINT ended.
INTERRUPTED = 130
#: stdout was closed by its reader (``txn-offsets jobs list | head -1``): 128 + 13 (SIGPIPE), what a
#: shell reports for git or coreutils there; nothing is printed.
CLOSED_PIPE = 141


class UsageError(Exception):
    """A wrong command line that argparse cannot see (a flag required by another, a malformed
    value): printed as argparse's own errors, one line naming the argument and the command's
    ``--help``, exit code 64. Raised before anything is changed."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        self.problem = problem
        super().__init__(f"argument {argument}: {problem}")

    @classmethod
    def of(cls, exc: ConfigError) -> UsageError:
        """A ConfigError about what the command line gave, as a usage error (its setting named as
        the option: ``role`` as ``--role``)."""
        return cls(exc.setting if exc.setting.startswith("-") else f"--{exc.setting}", exc.problem)
