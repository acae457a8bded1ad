"""GEPA's merge, the pure part: which two front candidates to merge over which common ancestor, the merged texts,
the validation minibatch the merge is first scored on, and whether it did worse there than its better parent.

Two candidates on the Pareto front, neither an ancestor of the other, that changed different components since a
common ancestor combine into one that takes each changed component from the candidate that changed it. The engine
orchestrates (when a merge is due, the budget, the evaluations, the records); everything here reads a `GepaState`
and, where a choice is random, the engine's RNG, so that a seed still gives the same search.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from prime_lab.gepa.adapter import Candidate
from prime_lab.gepa.pareto import front_frequencies
from prime_lab.gepa.state import GepaState

EPS = 1e-9  # score tolerance of every acceptance test (the engine's too)


@dataclass(frozen=True)
class MergePlan:
    """Merge candidates `first` and `second` (first < second) over their common ancestor `ancestor` into `texts`."""

    ancestor: int
    first: int
    second: int
    texts: Candidate


def merged_texts(ancestor: Candidate, first: Candidate, second: Candidate, components: Sequence[str],
                 first_wins_conflicts: bool) -> Candidate | None:
    """Each component from the candidate that changed it since `ancestor`; where both changed it, from `first` if
    `first_wins_conflicts`, else from `second`. None when the result is `first` or `second` itself (nothing to
    gain from scoring it)."""
    merged: Candidate = {}
    for name in components:
        if first[name] == ancestor[name]:
            merged[name] = second[name]
        elif second[name] == ancestor[name]:
            merged[name] = first[name]
        else:
            merged[name] = first[name] if first_wins_conflicts else second[name]
    return merged if merged not in (first, second) else None


def plan_for_pair(state: GepaState, first: int, second: int, components: Sequence[str]) -> MergePlan | None:
    """The merge of `first` and `second` over their latest common ancestor (highest index) whose merge is a new
    candidate; None when one descends from the other or no common ancestor gives a new one. Conflicts go to the
    higher average validation score, to `first` on a tie."""
    first_ancestors, second_ancestors = state.ancestors(first), state.ancestors(second)
    if first in second_ancestors or second in first_ancestors:
        return None
    first_wins = state.average(first) >= state.average(second)
    for ancestor in sorted(first_ancestors & second_ancestors, reverse=True):
        texts = merged_texts(state.candidates[ancestor], state.candidates[first], state.candidates[second],
                             components, first_wins)
        if texts is not None and texts not in state.candidates:
            return MergePlan(ancestor, first, second, texts)
    return None


def merge_plans(state: GepaState, components: Sequence[str]) -> list[MergePlan]:
    """Every possible merge of two candidates on the Pareto front (dominated candidates removed), by pair in
    ascending order: at most one per pair (`plan_for_pair`)."""
    front = sorted(front_frequencies(state.val_scores))
    plans: list[MergePlan] = []
    for pos, first in enumerate(front):
        for second in front[pos + 1:]:
            plan = plan_for_pair(state, first, second, components)
            if plan is not None:
                plans.append(plan)
    return plans


def choose_merge(state: GepaState, components: Sequence[str], rng: random.Random) -> MergePlan | None:
    """One of `merge_plans`, uniformly at random; None (and no draw from `rng`) when there is none."""
    plans = merge_plans(state, components)
    return rng.choice(plans) if plans else None


def merge_minibatch(num_val: int, size: int, rng: random.Random) -> list[int]:
    """The validation rows (ascending) a merge is scored on first: `size` of them, all when there are fewer."""
    return sorted(rng.sample(range(num_val), min(size, num_val)))


def best_parent_scores(state: GepaState, plan: MergePlan, rows: Sequence[int]) -> list[float]:
    """On each of `rows`, the better of the two parents' validation scores (what the merge's record shows)."""
    first, second = state.val_scores[plan.first], state.val_scores[plan.second]
    return [max(first[x], second[x]) for x in rows]


def worse_than_parents(state: GepaState, plan: MergePlan, rows: Sequence[int], scores: Sequence[float]) -> bool:
    """Whether the merge's `scores` on `rows` sum to less than the better parent's there (the sum of one parent's
    scores, not of the per-row best): such a merge is rejected before the rest of the validation set is spent."""
    better = max(sum(state.val_scores[plan.first][x] for x in rows),
                 sum(state.val_scores[plan.second][x] for x in rows))
    return sum(scores) < better - EPS
