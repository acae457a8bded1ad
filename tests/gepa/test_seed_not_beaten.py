"""When no candidate beats the seed: the README's `-B 10 -n 3 -N 3` search through real HTTP (the `openai` client
against a task endpoint whose constant answer no prompt can improve, and the reflection stand-in) ends with a line
that says so and names a budget that tries more; every proposal, rejected ones included, is an event, a log entry and
a row of proposals.jsonl with its full text; `prime gepa export` warns that it exports the seed. And the budget
accounting behind the suggestion matches what the engine spends."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prime_lab.gepa.adapter import Candidate, EvaluationBatch, ReflectiveDataset
from prime_lab.gepa.budget import budget_for, proposals_within
from prime_lab.gepa.engine import EngineConfig, GepaEngine
from prime_lab.gepa.reflection import parse_proposal
from prime_lab.gepa.runner import no_gain_note
from prime_lab.gepa.state import GepaState
from prime_lab.runs.events import EventLog
from tests.envs.scripted import scripted_endpoint
from tests.gepa.reflection_standin import proposal_for, reflection_standin
from tests.gepa.test_export import gepa_run
from tests.support.cli import prime

README = {"max_calls": 10, "num_train": 3, "num_val": 3, "minibatch_size": 3}  # prime gepa run my-env -B 10 -n 3 -N 3
SEED_PROMPT = "Reverse the text character by character."


@dataclass
class SearchResult:
    run_dir: Path
    env: dict[str, str]  # PRIME_LAB_HOME: the home whose registry holds the run
    stdout: str
    proposals_sent: list[str]  # what the reflection stand-in answered, parsed as the adapter parses it


@pytest.fixture(scope="module")
def seed_stays_best(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SearchResult]:
    tmp = tmp_path_factory.mktemp("seed-best")
    env = {**os.environ, "PRIME_LAB_HOME": str(tmp / "home")}
    with scripted_endpoint([]) as task, reflection_standin() as reflection:  # task: "(no more replies)", always
        config = tmp / "gepa.toml"
        config.write_text(f'model = "scripted"\nreflection_model = "stand-in"\nbase_url = "{task.base_url}"\n'
                          f'reflection_base_url = "{reflection.base_url}"\n[env]\nid = "reverse-text"\n[gepa]\n'
                          + "".join(f"{k} = {v}\n" for k, v in README.items()) + "[sampling]\nmax_tokens = 8\n")
        run_dir = tmp / "home" / "runs" / "seed-best"
        proc = prime("gepa", "run", f"@{config}", "-o", str(run_dir), cwd=tmp, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        sent = [parse_proposal(proposal_for(r["messages"][-1]["content"]), "") for r in reflection.requests]
    yield SearchResult(run_dir, env, proc.stdout, sent)


def test_the_last_line_says_no_candidate_beat_the_seed_and_names_a_budget(seed_stays_best: SearchResult) -> None:
    meta = json.loads((seed_stays_best.run_dir / "gepa" / "metadata.json").read_text())
    assert meta["best_idx"] == 0 and meta["num_candidates"] == 1
    last = seed_stays_best.stdout.strip().splitlines()[-1]
    assert last.startswith(f"no candidate beat the seed: 1 proposal, 0 accepted to validation, best is the seed "
                           f"({meta['seed_score']:.4f})")
    assert "try a larger budget: -B 30 tries 4 proposals with -n 3 -N 3 (-B 10 had room for 1)" in last
    log = (seed_stays_best.run_dir / "logs" / "gepa.log").read_text()
    assert log.strip().splitlines()[-1].endswith(last)
    logged = [e.data for e in EventLog(seed_stays_best.run_dir / "events.jsonl").events() if e.kind == "log"]
    assert logged[-1] == {"level": "WARNING", "message": last}  # `prime gepa logs` shows it too


def test_rejected_proposals_keep_their_text_in_events_log_and_outputs(seed_stays_best: SearchResult) -> None:
    run_dir = seed_stays_best.run_dir
    events = EventLog(run_dir / "events.jsonl").events()
    records = [e.data for e in events if e.kind == "gepa.iteration"]
    assert len(records) == 1 and len(seed_stays_best.proposals_sent) == 1
    record = records[0]
    assert record["verdict"] == "rejected" and record["accepted"] is False and record["child_idx"] is None
    assert record["texts"] == {"system_prompt": seed_stays_best.proposals_sent[0]}
    assert record["parent"] == 0 and len(record["parent_scores"]) == len(record["child_scores"]) == 2
    log = (run_dir / "logs" / "gepa.log").read_text()
    assert "iteration 1 reflection of #0: rejected  minibatch" in log
    assert f"    | {seed_stays_best.proposals_sent[0]}\n" in log
    logged = [e.data["message"] for e in events if e.kind == "log" and "iteration 1" in e.data["message"]]
    assert len(logged) == 1 and logged[0].endswith(f"    | {seed_stays_best.proposals_sent[0]}")
    out = run_dir / "gepa"
    rows = [json.loads(line) for line in (out / "proposals.jsonl").read_text().splitlines()]
    assert rows == [{k: v for k, v in record.items() if k not in ("seconds", "metric_calls", "best_idx",
                                                                     "best_score")}]
    candidates = (out / "candidates.jsonl").read_text().splitlines()
    assert len(candidates) == 1  # the rejected prompt is no candidate, but it is kept
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["beat_seed"], meta["num_proposals"], meta["num_accepted"]) == (False, 1, 0)


def test_export_warns_when_the_best_prompt_is_the_seed(seed_stays_best: SearchResult) -> None:
    proc = prime("gepa", "export", "seed-best", "--rl", env=seed_stays_best.env)
    assert proc.returncode == 0, proc.stderr
    assert "warning: no candidate of GEPA run seed-best beat the seed prompt" in proc.stderr
    assert "larger -B" in proc.stderr
    assert "# RL from GEPA run seed-best: no candidate beat the seed prompt" in proc.stdout


def test_export_of_a_run_that_beat_the_seed_gives_no_warning() -> None:
    run = gepa_run("reverse-text", "smollm2-135m")  # its metadata: best #1, 0.75 against the seed's 0.5
    proc = prime("gepa", "export", run.id, "--rl")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr and "starts from its best prompt" in proc.stdout


# The accounting behind the suggestion ---------------------------------------------------------------------------
class Rewriter:
    """Each reflection appends a numbered "!" to the prompt. `improves`: every "!" adds to the score (every child
    beats its parent); else every prompt scores the same (every proposal is rejected)."""

    def __init__(self, improves: bool = False) -> None:
        self.calls = 0
        self.improves = improves
        self.numbers = itertools.count(1)

    def evaluate(self, batch: Any, candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
        self.calls += len(batch)
        score = 0.5 + (0.01 * candidate["system_prompt"].count("!") if self.improves else 0.0)
        return EvaluationBatch(scores=[score] * len(batch), outputs=list(batch), trajectories=[{}] * len(batch))

    def make_reflective_dataset(self, candidate: Candidate, evaluation: EvaluationBatch,
                                components: Any) -> ReflectiveDataset:
        return {c: [] for c in components}

    def propose_new_texts(self, candidate: Candidate, dataset: ReflectiveDataset, components: Any) -> dict[str, str]:
        return {c: f"{candidate[c]} !{next(self.numbers)}" for c in components}


def search(adapter: Any, budget: int, parallel: int, events: list[dict[str, Any]] | None = None) -> GepaState:
    def emit(kind: str, data: dict[str, Any], step: int) -> None:
        if events is not None and kind == "gepa.iteration":
            events.append(data)
    config = EngineConfig(max_metric_calls=budget, minibatch_size=3, num_parallel_proposals=parallel)
    return GepaEngine(adapter, [100, 101, 102], [0, 1, 2], {"system_prompt": SEED_PROMPT}, config,
                      emit=emit).run()


@pytest.mark.parametrize("parallel", [1, 8])
def test_proposals_within_is_what_the_engine_tries(parallel: int) -> None:
    shape = {"num_train": 3, "num_val": 3, "minibatch_size": 3}
    for budget in range(1, 41):
        adapter = Rewriter()
        state = search(adapter, budget, parallel)
        assert state.num_proposed == proposals_within(budget, **shape), budget
        assert adapter.calls == state.metric_calls <= budget
    assert proposals_within(10, **shape) == 1 and budget_for(4, **shape) == 30
    assert proposals_within(30, **shape) == 4 and proposals_within(29, **shape) == 4  # 29: the last of 1 row


def test_at_the_suggested_budget_four_proposals_are_tried_whatever_is_accepted() -> None:
    """The README's line with -B 30: with the default -P 8 the four proposals run in one round beside the seed,
    so accepted children do not eat into them."""
    events: list[dict[str, Any]] = []
    adapter = Rewriter(improves=True)  # every child beats its parent on its minibatch
    state = search(adapter, 30, 8, events)
    assert len(events) == state.num_proposed == 4 and adapter.calls <= 30
    assert [e["verdict"] for e in events] == ["accepted", "not_validated", "not_validated", "not_validated"]
    for e in events:
        assert e["accepted"] == (e["verdict"] == "accepted")
        if e["accepted"]:
            assert e["texts"] == state.candidates[e["child_idx"]]
        else:
            assert e["texts"] not in state.candidates  # kept in its record only
    assert [p["texts"] for p in state.proposals] == [e["texts"] for e in events]


def test_the_note_is_absent_when_a_candidate_won_and_honest_when_the_seed_is_perfect() -> None:
    state = GepaState()
    state.add_candidate({"system_prompt": "a"}, [], "seed", [1.0, 1.0])
    state.num_val = 2
    state.add_proposal({"iteration": 1, "texts": {"system_prompt": "b"}, "verdict": "rejected", "accepted": False,
                        "seconds": 0.1})
    assert "seconds" not in state.proposals[0]
    note = no_gain_note(state, num_train=3, max_calls=20, minibatch_size=3, perfect_score=1.0)
    assert note == ("no candidate beat the seed: 1 proposal, 0 accepted to validation, best is the seed (1.0000); "
                    "it already scores 1 on every validation example")
    assert "-B 40 tries 6 proposals" in (no_gain_note(state, num_train=3, max_calls=20, minibatch_size=3) or "")
    state.add_candidate({"system_prompt": "c"}, [0], "reflection", [1.0, 1.0 + 1e-3])
    assert no_gain_note(state, num_train=3, max_calls=20, minibatch_size=3) is None


def test_a_state_saved_before_proposals_were_kept_still_loads(tmp_path: Path) -> None:
    data = GepaState().to_json()
    del data["proposals"]
    (tmp_path / "state.json").write_text(json.dumps(data))
    assert GepaState.load(tmp_path / "state.json").proposals == []
