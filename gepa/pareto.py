"""Per-instance Pareto fronts over validation scores, dominated-candidate removal and parent selection."""

from __future__ import annotations

import random
from collections.abc import Sequence

EPS = 1e-12


def instance_fronts(val_scores: Sequence[Sequence[float]]) -> list[set[int]]:
    """For each validation instance, the candidates with the best score on it."""
    if not val_scores:
        return []
    fronts: list[set[int]] = []
    for i in range(len(val_scores[0])):
        best = max(scores[i] for scores in val_scores)
        fronts.append({c for c, scores in enumerate(val_scores) if scores[i] >= best - EPS})
    return fronts


def remove_dominated(fronts: Sequence[set[int]], averages: Sequence[float]) -> list[set[int]]:
    """Drop candidates that are never needed: a candidate is dominated when every front it is on also holds
    another surviving candidate. Weakest (lowest average) first, so the stronger of two equals survives."""
    survivors = set().union(*fronts) if fronts else set()
    for cand in sorted(survivors, key=lambda c: (averages[c], -c)):
        on = [f for f in fronts if cand in f]
        if all(len(f & survivors) > 1 for f in on):
            survivors.discard(cand)
    return [f & survivors for f in fronts]


def front_frequencies(val_scores: Sequence[Sequence[float]]) -> dict[int, int]:
    """Candidate -> how many validation instances it is (non-dominated) best on."""
    averages = [sum(s) / len(s) if s else 0.0 for s in val_scores]
    counts: dict[int, int] = {}
    for front in remove_dominated(instance_fronts(val_scores), averages):
        for cand in front:
            counts[cand] = counts.get(cand, 0) + 1
    return counts


def select_parent(val_scores: Sequence[Sequence[float]], rng: random.Random) -> int:
    """Sample a parent in proportion to the number of instances it is best on."""
    counts = front_frequencies(val_scores)
    if not counts:
        return 0
    pool = sorted(counts)
    return rng.choices(pool, weights=[counts[c] for c in pool], k=1)[0]
