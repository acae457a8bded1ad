"""A hard metric-call budget shared by proposals running at once: calls are reserved before any is spent, so the
total never exceeds the cap however the proposals interleave."""

from __future__ import annotations

import threading


class BudgetExhausted(Exception):
    pass


class BudgetClosed(BudgetExhausted):
    """The search is stopping (interrupted or failed): nothing more may be spent."""


class MetricBudget:
    """`used` calls are spent; `reserved` are promised to proposals in flight and not yet spent.
    Thread-safe: proposals running concurrently spend from their own reservations."""

    def __init__(self, max_calls: int, used: int = 0) -> None:
        self.max_calls = max_calls
        self.used = used
        self.reserved = 0
        self.closed = False
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        """Calls not yet spent."""
        return max(0, self.max_calls - self.used)

    @property
    def available(self) -> int:
        """Calls neither spent nor promised to a proposal in flight."""
        return max(0, self.max_calls - self.used - self.reserved)

    def reserve(self, calls: int) -> Reservation:
        """Promise `calls` to one piece of work; refuses (raises) when they are not available."""
        with self._lock:
            if self.closed:
                raise BudgetClosed("the search is stopping")
            if calls > self.available:
                raise BudgetExhausted(f"{calls} calls asked, {self.available} available of {self.max_calls}")
            self.reserved += calls
        return Reservation(self, calls)

    def spend(self, calls: int) -> None:
        """Spend `calls` without a reservation (only safe when nothing else runs)."""
        self.reserve(calls).spend(calls)

    def close(self) -> None:
        """Refuse every later reservation and spend (in-flight work then stops at its next evaluation)."""
        with self._lock:
            self.closed = True


class Reservation:
    """Calls promised to one proposal: it spends from them, and gives back what it did not use."""

    def __init__(self, budget: MetricBudget, calls: int) -> None:
        self.budget = budget
        self.held = calls

    def spend(self, calls: int) -> None:
        budget = self.budget
        with budget._lock:
            if budget.closed:
                raise BudgetClosed("the search is stopping")
            if calls > self.held:
                raise BudgetExhausted(f"{calls} calls asked, {self.held} reserved")
            self.held -= calls
            budget.reserved -= calls
            budget.used += calls

    def release(self) -> None:
        with self.budget._lock:
            self.budget.reserved -= self.held
            self.held = 0
