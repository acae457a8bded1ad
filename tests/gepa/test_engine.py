"""The engine with a scripted adapter: acceptance, the hard budget, determinism, resume, merge, events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gepa.adapter import Candidate, EvaluationBatch
from gepa.engine import EngineConfig, GepaEngine
from gepa.pareto import front_frequencies
from gepa.state import GepaState
from tests.gepa.scripted_adapter import ScriptedAdapter, score_of

TRAIN = list(range(100, 120))
VAL = list(range(10))
SEED: Candidate = {"system_prompt": "Be helpful."}


def make_engine(budget: int, adapter: Any = None, state_path: Path | None = None, seed: int = 0,
                events: list[tuple[str, dict[str, Any]]] | None = None, **kw: Any) -> GepaEngine:
    def emit(kind: str, data: dict[str, Any], step: int) -> None:
        if events is not None:
            events.append((kind, data))
    return GepaEngine(adapter or ScriptedAdapter(), TRAIN, VAL, SEED,
                      EngineConfig(max_metric_calls=budget, minibatch_size=3, seed=seed, **kw),
                      state_path=state_path, emit=emit)


def test_accepts_only_strict_improvements_and_validates_each_accepted_child() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    state = make_engine(150, events=events).run()
    iterations = [d for k, d in events if k == "gepa.iteration"]
    assert iterations, "the search ran no iteration"
    for it in iterations:
        if it["verdict"] == "accepted":
            assert sum(it["child_scores"]) > sum(it["parent_scores"])
            idx = it["child_idx"]
            assert state.val_scores[idx] == [score_of(state.candidates[idx]["system_prompt"], r) for r in VAL]
            assert state.parents[idx] == [it["parent"]]
        elif it["verdict"] == "rejected":
            assert sum(it["child_scores"]) <= sum(it["parent_scores"])
            assert it["child_idx"] is None
    accepted = sum(it["verdict"] == "accepted" for it in iterations)
    assert len(state.candidates) == 1 + accepted
    assert state.best_idx == max(range(len(state.candidates)), key=lambda i: (state.average(i), -i))


@pytest.mark.parametrize("budget", range(1, 201))
def test_the_budget_is_never_exceeded(budget: int) -> None:
    adapter = ScriptedAdapter()
    state = make_engine(budget, adapter).run()
    assert adapter.calls == state.metric_calls <= budget
    assert state.finished and state.stop_reason == "budget"
    # nothing is left that one more iteration could have used: parent + child minibatch + a validation pass
    assert budget - state.metric_calls < 2 + state.num_val or state.num_val < len(VAL)


def test_same_seed_same_run_other_seed_other_run() -> None:
    a, b, c = (make_engine(120, seed=s).run() for s in (7, 7, 8))
    assert a.to_json() == b.to_json()
    assert a.to_json() != c.to_json()


@pytest.mark.parametrize("stop_after", [4, 25, 61])
def test_resume_after_an_interrupt_equals_an_uninterrupted_run(tmp_path: Path, stop_after: int) -> None:
    full = make_engine(150, use_merge=True).run()
    path = tmp_path / "state.json"
    with pytest.raises(KeyboardInterrupt):
        make_engine(150, ScriptedAdapter(fail_after_calls=stop_after), state_path=path, use_merge=True).run()
    saved = GepaState.load(path)
    assert saved.stop_reason == "interrupted"
    spent_before = saved.metric_calls
    resumed_adapter = ScriptedAdapter()
    resumed = make_engine(150, resumed_adapter, state_path=path, use_merge=True).run()
    assert resumed.metric_calls <= 150
    assert resumed_adapter.calls == resumed.metric_calls - spent_before  # nothing spent twice (the seed neither)
    if stop_after > len(VAL):  # interrupted after the seed: on an iteration boundary, same search afterwards
        assert resumed.candidates == full.candidates[: len(resumed.candidates)]


def test_resume_at_an_iteration_boundary_is_the_same_run(tmp_path: Path) -> None:
    full = make_engine(150).run()
    path = tmp_path / "state.json"
    make_engine(150, state_path=path, max_iterations=5).run()
    state = GepaState.load(path)
    state.finished = False
    state.save(path)
    resumed_adapter = ScriptedAdapter()
    resumed = make_engine(150, resumed_adapter, state_path=path).run()
    assert resumed.candidates == full.candidates and resumed.val_scores == full.val_scores
    assert resumed.metric_calls == full.metric_calls
    assert resumed_adapter.evaluations[0] == 3, "the resumed run re-evaluated the seed"


def test_perfect_minibatches_are_skipped() -> None:
    class Perfect(ScriptedAdapter):
        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            self.calls += len(batch)
            return EvaluationBatch(scores=[1.0] * len(batch), trajectories=[{}] * len(batch))

    events: list[tuple[str, dict[str, Any]]] = []
    make_engine(40, Perfect(), events=events, perfect_score=1.0).run()
    verdicts = {d["verdict"] for k, d in events if k == "gepa.iteration"}
    assert verdicts == {"skipped_perfect"}


def test_merge_combines_components_changed_in_different_branches() -> None:
    class TwoParts(ScriptedAdapter):
        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            self.calls += len(batch)
            text = candidate["a"] + candidate["b"]
            scores = [score_of(text, int(r)) for r in batch]
            return EvaluationBatch(scores=scores, trajectories=[{"row": r} for r in batch])

    engine = GepaEngine(TwoParts(), TRAIN, VAL, {"a": "A", "b": "B"},
                        EngineConfig(max_metric_calls=400, minibatch_size=3, use_merge=True, seed=3))
    state = engine.run()
    merges = [i for i, o in enumerate(state.origins) if o == "merge"]
    for m in merges:
        i, j = state.parents[m]
        assert all(state.candidates[m][c] in (state.candidates[i][c], state.candidates[j][c]) for c in "ab")
    assert state.merges_done >= 1


def test_events_describe_the_search() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    state = make_engine(60, events=events).run()
    kinds = {k for k, _ in events}
    assert kinds == {"gepa.iteration", "gepa.candidate", "gepa.frontier", "gepa.budget"}
    last_budget = [d for k, d in events if k == "gepa.budget"][-1]
    assert last_budget == {"used": state.metric_calls, "max": 60, "remaining": 60 - state.metric_calls}
    frontier = [d for k, d in events if k == "gepa.frontier"][-1]
    assert frontier["num_candidates"] == len(state.candidates)
    assert frontier["frequencies"] == {str(k): v for k, v in front_frequencies(state.val_scores).items()}
    json.dumps(events)  # every event is plain JSON
