"""evals.compare: the paired bootstrap interval, matching examples, and evaluations read from their folders."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from prime_lab.evals.compare import (
    ComparisonError,
    Evaluation,
    compare,
    compare_evaluations,
    load_evaluation,
    paired_bootstrap_ci,
)
from prime_lab.runs.registry import RunRegistry


def evaluation(rewards: dict[int, float], *, env: str = "tiny-chars", asks: dict[int, str] | None = None,
               source: str = "x", env_args: dict[str, Any] | None = None) -> Evaluation:
    keys = {i: ("tiny-chars", str(i)) for i in rewards}
    return Evaluation(source=source, path=Path(source), run_id=None, env_id=env, env_args=env_args or {},
                      model="tiny", policy=None, system_prompt=None, rollouts=len(rewards), errors=0,
                      rewards={keys[i]: r for i, r in rewards.items()},
                      asks={keys[i]: (asks or {}).get(i, f"question {i}") for i in rewards},
                      excerpts={keys[i]: f"question {i}" for i in rewards})


# The interval -----------------------------------------------------------------------------------------------------

def test_the_interval_covers_a_known_difference_on_synthetic_data() -> None:
    rng = random.Random(7)
    before = [rng.random() for _ in range(300)]
    after = [min(1.0, max(0.0, b + 0.1 + rng.gauss(0, 0.15))) for b in before]
    true = sum(a - b for a, b in zip(after, before, strict=True)) / len(before)
    low, high = paired_bootstrap_ci([a - b for a, b in zip(after, before, strict=True)])
    assert low < true < high
    assert 0.0 < low and high - low < 0.06  # 300 examples pin it down, and it is clearly better


def test_the_interval_covers_the_population_difference_about_95_times_in_100() -> None:
    rng = random.Random(3)
    covered = 0
    for trial in range(200):
        deltas = [rng.gauss(0.2, 0.5) for _ in range(60)]
        low, high = paired_bootstrap_ci(deltas, resamples=1000, seed=trial)
        covered += low <= 0.2 <= high
    assert 170 <= covered <= 199  # a percentile bootstrap of 60 examples is a little short of 95%, never far


def test_the_interval_is_narrow_when_every_example_moves_the_same_way() -> None:
    low, high = paired_bootstrap_ci([0.25] * 40)
    assert low == pytest.approx(0.25) and high == pytest.approx(0.25)
    spread = paired_bootstrap_ci([0.25 + 0.01 * (i % 3 - 1) for i in range(40)])
    assert 0.24 < spread[0] < 0.25 < spread[1] < 0.26


def test_identical_evaluations_give_an_interval_holding_zero() -> None:
    same = evaluation({i: i / 10 for i in range(10)})
    result = compare([same, same])
    [difference] = result.differences
    assert difference.mean == 0.0 and difference.low <= 0.0 <= difference.high and not difference.significant
    assert difference.changed == []


def test_the_interval_is_deterministic_under_its_seed() -> None:
    rng = random.Random(1)
    deltas = [rng.uniform(-1, 1) for _ in range(50)]
    assert paired_bootstrap_ci(deltas, seed=5) == paired_bootstrap_ci(deltas, seed=5)
    assert paired_bootstrap_ci(deltas, seed=5) != paired_bootstrap_ci(deltas, seed=6)


def test_the_interval_needs_differences() -> None:
    with pytest.raises(ValueError, match="no paired differences"):
        paired_bootstrap_ci([])


# Comparing --------------------------------------------------------------------------------------------------------

def test_compare_matches_examples_reports_means_differences_and_the_largest_changes() -> None:
    base = evaluation({0: 0.0, 1: 0.5, 2: 1.0, 3: 0.25, 4: 0.0, 5: 0.5, 6: 0.0}, source="base")
    trained = evaluation({0: 1.0, 1: 0.5, 2: 0.75, 3: 0.75, 4: 0.25, 5: 0.75, 6: 0.125, 7: 1.0}, source="trained")
    result = compare([base, trained])
    assert [row.example for row in result.examples] == ["0", "1", "2", "3", "4", "5", "6"]  # 7 is only in B
    assert result.examples[0].rewards == [0.0, 1.0] and result.examples[0].prompt == "question 0"
    a, b = result.evaluations
    assert (a.letter, b.letter) == ("A", "B")
    assert a.mean == pytest.approx(2.25 / 7) and b.mean == pytest.approx(4.125 / 7)
    assert (b.examples, b.dropped, a.dropped) == (8, 1, 0)
    assert any("compared the 7 examples" in note and "1 of B's 8" in note for note in result.notes)
    [difference] = result.differences
    assert difference.mean == pytest.approx(b.mean - a.mean)
    assert difference.low <= difference.mean <= difference.high
    # largest absolute change first, ties in example order; unchanged examples (1) never listed; at most five (6 not)
    assert [(c.example, c.delta) for c in difference.changed] == [
        ("0", 1.0), ("3", 0.5), ("2", -0.25), ("4", 0.25), ("5", 0.25)]


def test_three_evaluations_are_each_compared_with_the_first() -> None:
    a, b, c = (evaluation({i: v for i in range(5)}, source=s) for v, s in ((0.2, "a"), (0.4, "b"), (0.1, "c")))
    result = compare([a, b, c])
    assert [d.letter for d in result.differences] == ["B", "C"]
    assert [round(d.mean, 3) for d in result.differences] == [0.2, -0.1]
    assert result.examples[0].rewards == [0.2, 0.4, 0.1]


def test_compare_refuses_different_environments_and_different_examples() -> None:
    with pytest.raises(ComparisonError, match="different environments: x \\(tiny-chars\\), y \\(gsm8k\\)"):
        compare([evaluation({0: 1.0}), evaluation({0: 1.0}, env="gsm8k", source="y")])
    with pytest.raises(ComparisonError, match="no example in common"):
        compare([evaluation({0: 1.0}), evaluation({1: 1.0})])
    other = evaluation({0: 1.0, 1: 0.0}, asks={1: "another question"}, source="y", env_args={"target": "digits"})
    with pytest.raises(ComparisonError, match="1 of the 2 examples x and y share by example_id ask different"):
        compare([evaluation({0: 1.0, 1: 0.0}), other])
    with pytest.raises(ComparisonError, match="two evaluations or more"):
        compare([evaluation({0: 1.0})])


def test_different_env_args_with_the_same_examples_are_compared_with_a_note() -> None:
    result = compare([evaluation({0: 1.0}), evaluation({0: 0.0}, env_args={"max_turns": 2})])
    assert any("different environment args" in note for note in result.notes)


# Reading evaluations ----------------------------------------------------------------------------------------------

def write_evaluation(folder: Path, rewards: dict[int, list[float]], **metadata: Any) -> Path:
    folder.mkdir(parents=True)
    rows = [{"example_id": i, "task": "tiny-chars", "reward": r, "error": None,
             "prompt": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": f"Write letters. Example {i}."}]}
            for i, values in rewards.items() for r in values]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut short')
    (folder / "metadata.json").write_text(json.dumps({"env_id": "tiny-chars", "env_args": {}, "model": "tiny",
                                                      "run_id": None, **metadata}))
    return folder


def test_an_evaluation_folder_is_read_per_example_with_its_labels(tmp_path: Path) -> None:
    folder = write_evaluation(tmp_path / "e", {0: [1.0, 0.0], 1: [0.5, 0.5, 0.5]}, model="rl-x-step-2",
                              base_model="tiny",
                              policy={"run_id": "rl-x", "source": "adapters/step_2"},
                              system_prompt={"text": "Be long.", "source": "/p/best.txt", "gepa_run": None})
    loaded = load_evaluation(folder)
    assert loaded.rewards == {("tiny-chars", "0"): 0.5, ("tiny-chars", "1"): 0.5}
    assert loaded.rollouts == 5 and loaded.errors == 0
    assert loaded.label == "tiny + rl-x adapters/step_2, prompt best.txt"
    assert loaded.excerpts[("tiny-chars", "1")] == "Write letters. Example 1."


def test_evaluations_are_found_by_run_id_and_other_runs_are_refused(tmp_path: Path, lab_home: Path) -> None:
    registry = RunRegistry()
    run = registry.create("eval", config_text="", resolved={})
    folder = write_evaluation(tmp_path / "out", {0: [1.0]})
    run.update_status(output_dir=str(folder))
    assert load_evaluation(run.id).path == folder
    rl = registry.create("rl", config_text="", resolved={})
    with pytest.raises(ComparisonError, match=f"run {rl.id} is a rl run, not an evaluation .*--adapter {rl.id}"):
        load_evaluation(rl.id)
    with pytest.raises(ComparisonError, match="neither an evaluation's folder nor a run id"):
        load_evaluation("eval-nope")
    with pytest.raises(ComparisonError, match="no results.jsonl"):
        load_evaluation(tmp_path)
    other = write_evaluation(tmp_path / "other", {0: [0.0]})
    result = compare_evaluations([run.id, other])
    assert [e.run_id for e in result.evaluations] == [run.id, None]
    assert result.differences[0].mean == -1.0
