"""A hard metric-call budget: every evaluation asks before it spends, so the total never exceeds the cap."""

from __future__ import annotations

from dataclasses import dataclass


class BudgetExhausted(Exception):
    pass


@dataclass
class MetricBudget:
    max_calls: int
    used: int = 0

    @property
    def remaining(self) -> int:
        return max(0, self.max_calls - self.used)

    def spend(self, calls: int) -> None:
        """Record `calls` metric calls; refuses (raises) before going over the cap."""
        if calls > self.remaining:
            raise BudgetExhausted(f"{calls} calls asked, {self.remaining} left of {self.max_calls}")
        self.used += calls
