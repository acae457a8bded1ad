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


# Accounting: what a budget pays for ------------------------------------------------------------------------------
def minibatch_sizes(free: int, minibatch_size: int, num_train: int, limit: int) -> list[int]:
    """The minibatch of each proposal that `free` calls pay for, at most `limit` of them. A proposal scores its
    parent and its child on the same minibatch (two calls a row): full minibatches while they fit, then a smaller
    last one with what is left (as the sequential algorithm shrinks its last minibatch)."""
    sizes: list[int] = []
    while len(sizes) < limit:
        k = min(minibatch_size, num_train, free // 2)
        if k < 1:
            break
        sizes.append(k)
        free -= 2 * k
    return sizes


def proposals_within(max_calls: int, *, num_train: int, num_val: int, minibatch_size: int) -> int:
    """The proposals a budget tries when at most one child is accepted: what is left after the seed's validation
    and one validation pass kept for an accepted child, in minibatch pairs (the last minibatch may be smaller).
    Each further accepted child costs another validation pass (`num_val` calls), one proposal or so fewer; a
    proposal that is skipped or proposes nothing new costs less, leaving room for more."""
    nv = min(num_val, max_calls)
    return len(minibatch_sizes(max_calls - 2 * nv, minibatch_size, num_train, limit=max_calls))


def budget_for(proposals: int, *, num_train: int, num_val: int, minibatch_size: int) -> int:
    """The smallest budget that tries `proposals` full-size proposals (the inverse of `proposals_within`): the
    seed's validation, two minibatch evaluations a proposal, one validation pass for an accepted child."""
    return 2 * num_val + proposals * 2 * min(minibatch_size, num_train)
