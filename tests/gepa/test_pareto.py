"""Pareto bookkeeping, dominated-candidate removal and frequency-weighted parent selection."""

from __future__ import annotations

import random
from collections import Counter

from prime_lab.gepa.pareto import front_frequencies, instance_fronts, remove_dominated, select_parent


def test_instance_fronts_hold_every_candidate_tied_for_best() -> None:
    scores = [[0.1, 0.5, 0.9], [0.3, 0.5, 0.2], [0.3, 0.1, 0.0]]
    assert instance_fronts(scores) == [{1, 2}, {0, 1}, {0}]


def test_a_candidate_dominated_everywhere_is_removed() -> None:
    # 1 is >= 0 everywhere and better on one row: 0 is never needed.
    scores = [[0.5, 0.5, 0.2], [0.5, 0.6, 0.2], [0.0, 0.0, 0.9]]
    fronts = instance_fronts(scores)
    assert fronts[0] == {0, 1}
    kept = remove_dominated(fronts, [sum(s) / 3 for s in scores])
    assert kept == [{1}, {1}, {2}]
    assert front_frequencies(scores) == {1: 2, 2: 1}


def test_equal_candidates_keep_exactly_one() -> None:
    scores = [[0.5, 0.5], [0.5, 0.5]]
    assert front_frequencies(scores) == {1: 2} or front_frequencies(scores) == {0: 2}


def test_parent_selection_follows_front_frequencies() -> None:
    # candidate 0 best on 3 rows, candidate 1 on 1 row, candidate 2 nowhere.
    scores = [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]
    rng = random.Random(0)
    picks = Counter(select_parent(scores, rng) for _ in range(4000))
    assert picks[2] == 0
    assert 0.70 < picks[0] / 4000 < 0.80
    assert 0.20 < picks[1] / 4000 < 0.30
