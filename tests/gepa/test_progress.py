"""The terminal view of a search: the budget bar follows the calls spent, the best score and the last verdict
with a running count of accepted proposals."""

from __future__ import annotations

from prime_lab.workbench.cli.gepa_progress import GepaProgress


def test_progress_shows_budget_best_and_verdicts() -> None:
    view = GepaProgress(60, enabled=False)
    view.on_event("gepa.budget", {"used": 16, "max": 60, "remaining": 44, "spent": 3})
    view.on_event("gepa.frontier", {"best_score": 0.4567, "best_idx": 2, "num_candidates": 3})
    for n, verdict in enumerate(["rejected", "accepted", "rejected"], 1):
        view.on_event("gepa.iteration", {"iteration": n, "type": "reflection", "verdict": verdict})
    task = view.progress.tasks[0]
    assert task.completed == 16 and task.total == 60
    assert task.fields["best"] == "0.457 (#2 of 3)"
    assert task.fields["last"] == "iter 3 reflection: rejected (1 of 3 accepted)"
