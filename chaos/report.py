"""The tally of a chaos session and its one-line verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from chaos.invariants import Check

__all__ = ["Report", "ScenarioResult"]


@dataclass
class ScenarioResult:
    """One scenario: what it injected and what the checks found."""

    name: str
    runs: int = 0
    faults: int = 0
    messages: int = 0
    lost: int = 0
    duplicated: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, check: Check, *, when: str) -> None:
        """Fold one invariant check in (every check counts: a mid-scenario duplicate is one)."""
        self.lost += check.lost
        self.duplicated += check.duplicated
        self.violations.extend(f"{when}: {v}" for v in check.violations)

    def fail(self, message: str) -> None:
        self.violations.append(message)

    @property
    def ok(self) -> bool:
        return not self.violations and self.lost == 0 and self.duplicated == 0

    def line(self) -> str:
        status = "ok" if self.ok else "FAILED"
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        return (
            f"  {self.name:<4} {status:<6} runs={self.runs} faults={self.faults} messages={self.messages} "
            f"lost={self.lost} duplicated={self.duplicated} seconds={self.seconds:.0f}{extra}"
        )


@dataclass
class Report:
    seed: int
    scenarios: list[ScenarioResult] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum(s.runs for s in self.scenarios)

    @property
    def faults(self) -> int:
        return sum(s.faults for s in self.scenarios)

    @property
    def messages(self) -> int:
        return sum(s.messages for s in self.scenarios)

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.scenarios)

    @property
    def duplicated(self) -> int:
        return sum(s.duplicated for s in self.scenarios)

    @property
    def ok(self) -> bool:
        return bool(self.scenarios) and all(s.ok for s in self.scenarios)

    def summary(self) -> str:
        """The last line of ``make chaos``."""
        return (
            f"chaos: runs={self.runs} faults={self.faults} messages={self.messages} "
            f"lost={self.lost} duplicated={self.duplicated}"
        )

    def details(self) -> list[str]:
        lines = [f"chaos seed={self.seed}"]
        for s in self.scenarios:
            lines.append(s.line())
            lines.extend(f"    violation: {v}" for v in s.violations[:20])
        return lines
