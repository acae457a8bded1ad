"""The engine with a scripted adapter: acceptance, the hard budget, determinism, resume, merge, events; each with
one proposal at a time (the sequential algorithm) and with parallel proposals (rounds of four)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prime_lab.gepa.adapter import Candidate, EvaluationBatch
from prime_lab.gepa.engine import EngineConfig, GepaEngine
from prime_lab.gepa.pareto import front_frequencies
from prime_lab.gepa.state import GepaState
from tests.gepa.scripted_adapter import ScriptedAdapter, score_of

TRAIN = list(range(100, 120))
VAL = list(range(10))
SEED: Candidate = {"system_prompt": "Be helpful."}


def make_engine(budget: int, adapter: Any = None, state_path: Path | None = None, seed: int = 0,
                events: list[tuple[str, dict[str, Any]]] | None = None, parallel: int = 1, **kw: Any) -> GepaEngine:
    def emit(kind: str, data: dict[str, Any], step: int) -> None:
        if events is not None:
            events.append((kind, data))
    return GepaEngine(adapter or ScriptedAdapter(), TRAIN, VAL, SEED,
                      EngineConfig(max_metric_calls=budget, minibatch_size=3, seed=seed,
                                   num_parallel_proposals=parallel, **kw),
                      state_path=state_path, emit=emit)


@pytest.mark.parametrize("parallel", [1, 4])
def test_accepts_only_strict_improvements_and_validates_each_accepted_child(parallel: int) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    state = make_engine(150, events=events, parallel=parallel).run()
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


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("budget", range(1, 201))
def test_the_budget_is_never_exceeded(budget: int, parallel: int) -> None:
    adapter = ScriptedAdapter()
    state = make_engine(budget, adapter, parallel=parallel).run()
    assert adapter.calls == state.metric_calls <= budget
    assert state.finished and state.stop_reason == "budget"
    # nothing is left that one more iteration could have used: parent + child minibatch + a validation pass
    assert budget - state.metric_calls < 2 + state.num_val or state.num_val < len(VAL)


def test_same_seed_same_run_other_seed_other_run() -> None:
    a, b, c = (make_engine(120, seed=s).run() for s in (7, 7, 8))
    assert a.to_json() == b.to_json()
    assert a.to_json() != c.to_json()


def test_parallel_proposals_are_deterministic_whatever_order_they_finish_in() -> None:
    """Threads finish in a random order (jitter); the search depends only on the seed."""
    runs = []
    for seed in (7, 7, 7, 8):
        adapter = ScriptedAdapter(jitter=0.004)
        runs.append(make_engine(200, adapter, seed=seed, parallel=4, use_merge=True).run().to_json())
        assert adapter.max_in_flight > 1, "the proposals did not overlap"
    assert runs[0] == runs[1] == runs[2]
    assert runs[0] != runs[3]
    assert len(runs[0]["candidates"]) > 2


def test_a_round_runs_its_proposals_at_once() -> None:
    """The four parent evaluations of the first round wait for each other: only concurrent proposals pass."""
    barrier = threading.Barrier(4, timeout=10)

    class Rendezvous(ScriptedAdapter):
        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            if capture_traces and candidate == SEED and self.calls < len(VAL) + 12:
                barrier.wait()
            return super().evaluate(batch, candidate, capture_traces)

    events: list[tuple[str, dict[str, Any]]] = []
    state = make_engine(100, Rendezvous(), events=events, parallel=4).run()
    first_round = [d for k, d in events if k == "gepa.iteration"][:4]
    assert [d["iteration"] for d in first_round] == [1, 2, 3, 4]
    assert all(d["round_size"] == 4 and d["parent"] == 0 for d in first_round)
    assert state.metric_calls <= 100


@pytest.mark.parametrize("parallel", [1, 4])
def test_a_round_reserves_every_call_it_may_spend(parallel: int) -> None:
    """Every child improves, so every proposal wants a validation pass: with room for one only, the others are
    reported unvalidated and the cap holds."""
    class AlwaysBetter(ScriptedAdapter):
        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            self.calls += len(batch)
            score = candidate["system_prompt"].count("+") / 100
            return EvaluationBatch(scores=[score] * len(batch), trajectories=[{"row": r} for r in batch])

    events: list[tuple[str, dict[str, Any]]] = []
    adapter = AlwaysBetter()
    budget = len(VAL) + 4 * 6 + len(VAL) + 5  # seed, four proposals' minibatches, one validation, five spare
    state = make_engine(budget, adapter, events=events, parallel=parallel).run()
    assert adapter.calls == state.metric_calls <= budget
    verdicts = [d["verdict"] for k, d in events if k == "gepa.iteration"]
    if parallel == 4:
        assert verdicts == ["accepted", "not_validated", "not_validated", "not_validated"]
        assert state.metric_calls == budget - 5
    else:
        assert verdicts == ["accepted", "accepted"]  # 16 calls an iteration: two fit
    assert len(state.candidates) == 1 + verdicts.count("accepted")
    for idx in range(len(state.candidates)):
        assert len(state.val_scores[idx]) == len(VAL)


def test_a_round_fills_the_budget_with_a_smaller_last_minibatch() -> None:
    """Budget 60, validation 10: after the seed, six proposals of three rows and one of two fit beside one
    validation pass, so one round of seven spends what is left, as far as nothing is accepted."""
    class NeverBetter(ScriptedAdapter):
        def propose_new_texts(self, candidate: Candidate, dataset: Any, components: Any) -> dict[str, str]:
            return {"system_prompt": candidate["system_prompt"] + "-" + str(dataset["system_prompt"][0]["row"])}

        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            self.calls += len(batch)
            score = 0.5 - candidate["system_prompt"].count("-") / 100
            return EvaluationBatch(scores=[score] * len(batch), trajectories=[{"row": r} for r in batch])

    events: list[tuple[str, dict[str, Any]]] = []
    state = make_engine(60, NeverBetter(), events=events, parallel=8).run()
    records = [d for k, d in events if k == "gepa.iteration"]
    assert [len(r["minibatch"]) for r in records] == [3, 3, 3, 3, 3, 3, 2]
    assert {r["round_size"] for r in records} == {7} and {r["verdict"] for r in records} == {"rejected"}
    assert state.metric_calls == 10 + 2 * 20 and state.stop_reason == "budget"


def test_when_few_validations_fit_the_largest_improvements_get_them() -> None:
    """Minibatches of one row: the reflection adds row % 5 marks '+' (better by that much) on even rows and a
    '-' (worse) on odd rows. A round of four holds one validation pass; it goes to the accepted child that
    improved most on its minibatch (the earliest of equals), whatever its place in the round."""
    class Graded(ScriptedAdapter):
        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            self.calls += len(batch)
            text = candidate["system_prompt"]
            score = 0.5 + 0.01 * (text.count("+") - text.count("-"))
            return EvaluationBatch(scores=[score] * len(batch), trajectories=[{"row": r} for r in batch])

        def propose_new_texts(self, candidate: Candidate, dataset: Any, components: Any) -> dict[str, str]:
            row = dataset["system_prompt"][0]["row"]
            marks = "+" * (row % 5) if row % 2 == 0 else "-"
            return {"system_prompt": f"{candidate['system_prompt']} {marks}{row}"}

    val = [0, 1]
    budget = len(val) + 4 * 2 + len(val)  # seed; four minibatches of one, parent and child; one validation
    chosen_later = False
    for seed in range(30):
        events: list[tuple[str, dict[str, Any]]] = []
        adapter = Graded()
        engine = GepaEngine(adapter, TRAIN, val, SEED, EngineConfig(max_metric_calls=budget, minibatch_size=1,
                                                                     seed=seed, num_parallel_proposals=4),
                            emit=lambda kind, data, step: events.append((kind, data)))  # noqa: B023
        state = engine.run()
        records = [d for k, d in events if k == "gepa.iteration"]
        assert len(records) == 4 and adapter.calls == state.metric_calls <= budget
        improved = [r for r in records if r["minibatch"][0] % 2 == 0 and r["minibatch"][0] % 5 > 0]
        assert all(r["verdict"] in ("rejected", "unchanged") for r in records if r not in improved)
        if not improved:
            continue
        best = max(improved, key=lambda r: (r["minibatch"][0] % 5, -r["iteration"]))
        assert [r["verdict"] for r in improved] == ["accepted" if r is best else "not_validated" for r in improved]
        assert best["child_idx"] == 1 and len(state.candidates) == 2 and len(state.val_scores[1]) == 2
        chosen_later = chosen_later or best is not improved[0]
    assert chosen_later, "no seed made a later child the most improved one"


def test_the_first_round_beside_the_seed_is_the_round_after_it(tmp_path: Path) -> None:
    """Scoring the seed while the first round runs changes nothing: the same search as scoring it first."""
    events: list[tuple[str, dict[str, Any]]] = []
    overlapped = make_engine(150, events=events, parallel=4).run()
    path = tmp_path / "state.json"
    make_engine(150, state_path=path, parallel=1, max_iterations=0).run()  # the seed alone, saved
    state = GepaState.load(path)
    assert len(state.candidates) == 1 and state.iteration == 0
    state.finished = False
    state.save(path)
    after_seed = make_engine(150, state_path=path, parallel=4).run()
    for key in ("candidates", "parents", "val_scores", "found_at_calls", "found_at_iteration", "metric_calls",
                "iteration", "epoch_order", "rng_state"):
        assert getattr(overlapped, key) == getattr(after_seed, key), key
    # the seed's score is announced as soon as it is in, before the first round's outcomes
    kinds = [(k, d.get("idx")) for k, d in events if k in ("gepa.candidate", "gepa.iteration")]
    assert kinds[0] == ("gepa.candidate", 0)


def test_an_interrupt_after_the_seed_is_scored_keeps_the_seed(tmp_path: Path) -> None:
    """The first round runs beside the seed's validation; stopped after that validation, the resumed run does
    not score the seed again."""
    path = tmp_path / "state.json"

    def seed_saved() -> bool:
        return path.exists() and bool(GepaState.load(path).candidates)

    class StopAfterSeed(ScriptedAdapter):
        def propose_new_texts(self, candidate: Candidate, dataset: Any, components: Any) -> dict[str, str]:
            deadline = time.monotonic() + 10
            while not seed_saved() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise KeyboardInterrupt

    class SeedCounter(ScriptedAdapter):
        seed_validations = 0

        def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
            if candidate == SEED and len(batch) == len(VAL):
                self.seed_validations += 1
            return super().evaluate(batch, candidate, capture_traces)

    with pytest.raises(KeyboardInterrupt):
        make_engine(150, StopAfterSeed(), state_path=path, parallel=4).run()
    saved = GepaState.load(path)
    assert saved.stop_reason == "interrupted" and len(saved.candidates) == 1 and saved.iteration == 0
    assert len(VAL) < saved.metric_calls <= len(VAL) + 4 * 3  # the seed's validation and parents' minibatches
    resumed_adapter = SeedCounter()
    resumed = make_engine(150, resumed_adapter, state_path=path, parallel=4).run()
    assert resumed_adapter.seed_validations == 0, "the resumed run scored the seed again"
    assert resumed_adapter.calls == resumed.metric_calls - saved.metric_calls <= 150 - saved.metric_calls
    assert resumed.candidates[0] == SEED and resumed.val_scores[0] == saved.val_scores[0]


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("stop_after", [4, 25, 61])
def test_resume_after_an_interrupt_equals_an_uninterrupted_run(tmp_path: Path, stop_after: int,
                                                               parallel: int) -> None:
    full = make_engine(150, use_merge=True, parallel=parallel).run()
    path = tmp_path / "state.json"
    with pytest.raises(KeyboardInterrupt):
        make_engine(150, ScriptedAdapter(fail_after_calls=stop_after), state_path=path, use_merge=True,
                    parallel=parallel).run()
    saved = GepaState.load(path)
    assert saved.stop_reason == "interrupted"
    spent_before = saved.metric_calls
    resumed_adapter = ScriptedAdapter()
    resumed = make_engine(150, resumed_adapter, state_path=path, use_merge=True, parallel=parallel).run()
    assert resumed.metric_calls <= 150
    assert resumed_adapter.calls == resumed.metric_calls - spent_before  # nothing spent twice (the seed neither)
    if stop_after > len(VAL):  # interrupted after the seed: on an iteration boundary, same search afterwards
        assert resumed.candidates == full.candidates[: len(resumed.candidates)]


@pytest.mark.parametrize("parallel", [1, 4])
def test_resume_at_a_round_boundary_is_the_same_run(tmp_path: Path, parallel: int) -> None:
    full = make_engine(150, parallel=parallel).run()
    path = tmp_path / "state.json"
    make_engine(150, state_path=path, max_iterations=8, parallel=parallel).run()
    state = GepaState.load(path)
    assert state.iteration == 8
    state.finished = False
    state.save(path)
    resumed_adapter = ScriptedAdapter()
    resumed = make_engine(150, resumed_adapter, state_path=path, parallel=parallel).run()
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
    assert last_budget["used"] == state.metric_calls
    assert last_budget == {"used": state.metric_calls, "max": 60, "remaining": 60 - state.metric_calls,
                           "spent": last_budget["spent"]}
    assert sum(d["spent"] for k, d in events if k == "gepa.budget") == state.metric_calls
    frontier = [d for k, d in events if k == "gepa.frontier"][-1]
    assert frontier["num_candidates"] == len(state.candidates)
    assert frontier["frequencies"] == {str(k): v for k, v in front_frequencies(state.val_scores).items()}
    json.dumps(events)  # every event is plain JSON
