"""Merge on small hand-built states, without an engine: which pair and ancestor are chosen, which text each
component of the merge takes, and when a merge is worse than its parents."""

from __future__ import annotations

import random

from prime_lab.gepa.adapter import Candidate
from prime_lab.gepa.merge import (
    MergePlan,
    best_parent_scores,
    choose_merge,
    merge_minibatch,
    merge_plans,
    merged_texts,
    plan_for_pair,
    worse_than_parents,
)
from prime_lab.gepa.state import GepaState

ABC = ["a", "b", "c"]


def build(*candidates: tuple[Candidate, list[int], list[float]]) -> GepaState:
    """A state holding these (texts, parents, validation scores), in order."""
    state = GepaState(num_val=len(candidates[0][2]))
    for texts, parents, scores in candidates:
        state.add_candidate(texts, parents, "seed" if not parents else "reflection", scores)
    return state


def two_branches() -> GepaState:
    """The seed, one child that rewrote `a` and one that rewrote `b`, each best on one validation row."""
    return build(({"a": "A", "b": "B", "c": "C"}, [], [0.0, 0.0, 0.0]),
                 ({"a": "A1", "b": "B", "c": "C"}, [0], [1.0, 0.0, 0.5]),
                 ({"a": "A", "b": "B2", "c": "C"}, [0], [0.0, 1.0, 0.5]))


def test_each_component_comes_from_the_branch_that_changed_it() -> None:
    assert merge_plans(two_branches(), ABC) == [MergePlan(0, 1, 2, {"a": "A1", "b": "B2", "c": "C"})]


def test_a_component_both_changed_comes_from_the_preferred_one() -> None:
    base = {"a": "A", "b": "B", "c": "C"}
    first, second = {"a": "A1", "b": "B1", "c": "C"}, {"a": "A2", "b": "B", "c": "C2"}
    assert merged_texts(base, first, second, ABC, first_wins_conflicts=True) == {"a": "A1", "b": "B1", "c": "C2"}
    assert merged_texts(base, first, second, ABC, first_wins_conflicts=False) == {"a": "A2", "b": "B1", "c": "C2"}


def test_a_merge_equal_to_one_of_its_parents_is_no_merge() -> None:
    base = {"a": "A", "b": "B", "c": "C"}
    # the second changed everything the first did, and won the conflict: the merge would be the second again
    assert merged_texts(base, {"a": "A1", "b": "B", "c": "C"}, {"a": "A2", "b": "B2", "c": "C"}, ABC,
                        first_wins_conflicts=False) is None


def test_conflicts_go_to_the_higher_average_and_to_the_first_on_a_tie() -> None:
    def state(first_scores: list[float], second_scores: list[float]) -> GepaState:
        return build(({"a": "A", "b": "B", "c": "C"}, [], [0.0, 0.0]),
                     ({"a": "A1", "b": "B1", "c": "C"}, [0], first_scores),
                     ({"a": "A2", "b": "B", "c": "C2"}, [0], second_scores))

    better_second = plan_for_pair(state([1.0, 0.0], [0.0, 1.5]), 1, 2, ABC)
    assert better_second is not None and better_second.texts == {"a": "A2", "b": "B1", "c": "C2"}
    tie = plan_for_pair(state([1.0, 0.0], [0.0, 1.0]), 1, 2, ABC)
    assert tie is not None and tie.texts == {"a": "A1", "b": "B1", "c": "C2"}


def test_the_latest_common_ancestor_is_the_base() -> None:
    # 0 -> 1 (rewrote b) -> 2 (rewrote a) and 1 -> 3 (rewrote c): 0 and 1 are common ancestors, 1 is the latest
    state = build(({"a": "A", "b": "B", "c": "C"}, [], [0.0, 0.0]),
                  ({"a": "A", "b": "B1", "c": "C"}, [0], [0.1, 0.1]),
                  ({"a": "A2", "b": "B1", "c": "C"}, [1], [1.0, 0.0]),
                  ({"a": "A", "b": "B1", "c": "C3"}, [1], [0.0, 1.0]))
    assert choose_merge(state, ABC, random.Random(0)) == MergePlan(1, 2, 3, {"a": "A2", "b": "B1", "c": "C3"})


def test_an_older_ancestor_serves_when_the_latest_gives_nothing_new() -> None:
    # 1 rewrote the seed's `a`; its children 2 (put `a` back, rewrote `b`) and 3 (rewrote `b`) share ancestors 0
    # and 1. Over 1 the merge is 2 itself (its `a`, and its `b`, as it wins the conflict); over 0 it is new
    state = build(({"a": "A", "b": "B"}, [], [0.0, 0.0]),
                  ({"a": "X", "b": "B"}, [0], [0.0, 0.0]),
                  ({"a": "A", "b": "B1"}, [1], [1.0, 0.5]),
                  ({"a": "X", "b": "B2"}, [1], [0.0, 1.0]))
    assert plan_for_pair(state, 2, 3, ["a", "b"]) == MergePlan(0, 2, 3, {"a": "X", "b": "B1"})


def test_no_merge_of_a_candidate_with_its_descendant_nor_one_that_exists() -> None:
    # 2 descends from 1 but put its `a` back: over 0 the two would otherwise merge into {A1, B2}
    line = build(({"a": "A", "b": "B"}, [], [0.0, 1.0]),
                 ({"a": "A1", "b": "B"}, [0], [1.0, 0.0]),
                 ({"a": "A", "b": "B2"}, [1], [0.5, 0.5]))
    assert plan_for_pair(line, 0, 2, ["a", "b"]) is None and plan_for_pair(line, 1, 2, ["a", "b"]) is None
    done = two_branches()
    done.add_candidate({"a": "A1", "b": "B2", "c": "C"}, [1, 2], "merge", [0.0, 0.0, 0.0])
    assert merge_plans(done, ABC) == []
    assert choose_merge(done, ABC, random.Random(0)) is None


def test_only_candidates_on_the_front_are_merged() -> None:
    state = two_branches()
    state.val_scores[2] = [0.0, 0.0, 0.4]  # candidate 1 now beats it everywhere
    assert merge_plans(state, ABC) == []


def test_the_choice_among_several_merges_follows_the_rng() -> None:
    # three branches from the seed, each best on its own row: three pairs to merge
    state = build(({"a": "A", "b": "B", "c": "C"}, [], [0.0, 0.0, 0.0]),
                  ({"a": "A1", "b": "B", "c": "C"}, [0], [1.0, 0.0, 0.0]),
                  ({"a": "A", "b": "B2", "c": "C"}, [0], [0.0, 1.0, 0.0]),
                  ({"a": "A", "b": "B", "c": "C3"}, [0], [0.0, 0.0, 1.0]))
    plans = merge_plans(state, ABC)
    assert [(p.first, p.second) for p in plans] == [(1, 2), (1, 3), (2, 3)]
    chosen = {(p.first, p.second) for p in (choose_merge(state, ABC, random.Random(s)) for s in range(30)) if p}
    assert chosen == {(1, 2), (1, 3), (2, 3)}
    rng = random.Random(7)
    assert choose_merge(state, ABC, rng) == random.Random(7).choice(plans)


def test_the_merge_minibatch_is_sorted_distinct_rows() -> None:
    rows = merge_minibatch(10, 3, random.Random(1))
    assert rows == sorted(set(rows)) and len(rows) == 3 and all(0 <= r < 10 for r in rows)
    assert merge_minibatch(2, 3, random.Random(1)) == [0, 1]


def test_a_merge_need_only_match_its_better_parent_not_the_best_of_each_row() -> None:
    state = two_branches()
    plan = MergePlan(0, 1, 2, {"a": "A1", "b": "B2", "c": "C"})
    rows = [0, 1]
    assert best_parent_scores(state, plan, rows) == [1.0, 1.0]
    assert not worse_than_parents(state, plan, rows, [0.5, 0.5])  # sums to 1.0, as each parent does there
    assert worse_than_parents(state, plan, rows, [0.5, 0.4])
