"""The readiness verdict of an evaluation (ready, not ready, not a baseline), judged from the files a real
evaluation writes: `run_evaluation` against a scripted endpoint (which replies what each case needs), and once
against the built-in server on the tiny model, whose completions max_tokens cuts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import SamplingArgs, load_environment
from prime_lab.evals.evaluation import EvalResult, EvalSpec, SystemPrompt, run_evaluation
from prime_lab.evals.policies import TrainedPolicy
from prime_lab.evals.readiness import Readiness, ReadinessError, read_readiness
from tests.envs.scripted import scripted_endpoint

ENV_ARGS = {"difficulty": "easy"}


def answers(n: int) -> list[str]:
    return [f"<answer>{r['answer']}</answer>" for r in load_environment("gsm8k", **ENV_ARGS).get_eval_dataset(n)]


def evaluate(out: Path, replies: list[str], *, n: int = 3, r: int = 2,
             system_prompt: SystemPrompt | None = None, policy: TrainedPolicy | None = None,
             base_url: str | None = None, model: str = "scripted", max_tokens: int = 256) -> EvalResult:
    """gsm8k (easy), n examples x r rollouts, one at a time (the replies go to the rollouts in order), written to
    `out` as `prime eval run` writes it (the policy and the prompt recorded as its launcher records them)."""
    records = {"base_model": policy.base_model if policy else model,
               "policy": policy.metadata() if policy else None,
               "system_prompt": system_prompt.metadata() if system_prompt else None}

    def spec(url: str) -> EvalSpec:
        return EvalSpec(env_id="gsm8k", model=model, base_url=url, env_args=ENV_ARGS, num_examples=n,
                        rollouts_per_example=r, sampling=SamplingArgs(max_tokens=max_tokens), max_concurrent=1,
                        system_prompt=system_prompt.text if system_prompt else None, metadata=records)

    if base_url is not None:
        return run_evaluation(spec(base_url), out)
    with scripted_endpoint(list[str | None | dict[str, Any]](replies)) as ep:
        return run_evaluation(spec(ep.base_url), out)


def right_wrong(n: int = 3) -> list[str]:
    return [x for a in answers(n) for x in (a, "<answer>-1</answer>")]


def read_back(result: EvalResult) -> Readiness:
    """The verdict read from the files (as `prime eval get` reads it), the same as the one the evaluation gave."""
    again = read_readiness(result.output_dir)
    assert again.to_dict() == result.readiness.to_dict()
    written = json.loads((result.output_dir / "metadata.json").read_text())["readiness"]
    assert written == result.readiness.to_dict()
    return again


def test_ready_every_check_a_pass(tmp_path: Path) -> None:
    verdict = read_back(evaluate(tmp_path / "ready", right_wrong()))
    assert verdict.state == "ready" and verdict.headline == "ready for RL"
    assert verdict.subject == "the base model scripted with the environment's system prompt"
    assert verdict.problems == [] and verdict.to_try == [] and verdict.instead is None
    assert verdict.passes == ["mean reward 0.500 is above 0 and below 0.8: there is room to learn",
                              "rewards vary within examples (mean per-example std 0.500; 0% of examples got one "
                              "reward on every rollout)"]
    assert verdict.lines()[0] == "verdict: ready for RL (the base model scripted with the environment's system prompt)"


def test_not_ready_lists_the_pass_and_the_problem_apart(tmp_path: Path) -> None:
    """The issue's case: a mean in range (a pass) and rewards that never vary within an example (a problem)."""
    first = answers(1)[0]
    verdict = read_back(evaluate(tmp_path / "flat", [first, first] + ["<answer>-1</answer>"] * 4))
    assert verdict.state == "not ready"
    assert verdict.passes == ["mean reward 0.333 is above 0 and below 0.8: there is room to learn"]
    assert len(verdict.problems) == 1 and verdict.problems[0].startswith(
        "100% of examples got one reward on every rollout: their group advantages are zero")
    assert verdict.to_try == []  # some rollouts got a reward
    lines = verdict.lines()
    assert lines[1] == "  pass     mean reward 0.333 is above 0 and below 0.8: there is room to learn"
    assert lines[2].startswith("  problem  100% of examples")


def test_a_task_too_easy_and_one_rollout_per_example_are_problems(tmp_path: Path) -> None:
    verdict = read_back(evaluate(tmp_path / "easy", answers(3), r=1))
    assert verdict.state == "not ready" and verdict.passes == []
    assert verdict.problems == [
        "mean reward 1.000 is 0.8 or more: the task is too easy for this model, little is left to learn (make it "
        "harder, or take a smaller model)",
        "one rollout per example: whether rewards vary within an example is not measured (evaluate with -r 2 or "
        "more)"]


def test_a_trained_policy_is_not_a_baseline(tmp_path: Path) -> None:
    policy = TrainedPolicy(run_id="rl-abc123", run_kind="rl", step=20, kind="adapter",
                           path=tmp_path / "runs" / "rl-abc123" / "adapters" / "step_20", base_model="smollm2-135m",
                           base_model_path=tmp_path / "models" / "smollm2-135m")
    verdict = read_back(evaluate(tmp_path / "adapter", right_wrong(), policy=policy, model=policy.name))
    assert verdict.state == "not a baseline" and verdict.headline == "not a baseline"
    assert verdict.subject == "an evaluation of rl-abc123's adapters/step_20, trained by RL on smollm2-135m"
    assert verdict.instead is not None and "`prime eval run gsm8k -m smollm2-135m`" in verdict.instead
    assert "baseline" not in " ".join(verdict.passes + verdict.problems)  # its checks never call it one
    assert len(verdict.passes) == 2 and verdict.problems == []  # the checks still describe a start from it


def test_a_system_prompt_is_not_a_baseline_unless_it_is_the_environments_own(tmp_path: Path) -> None:
    from prime_lab.envs.builtin.gsm8k import SYSTEM_PROMPT

    gepa = SystemPrompt("Give only the number, in <answer> tags.", tmp_path / "best_prompt.txt", gepa_run="gepa-xyz")
    verdict = read_back(evaluate(tmp_path / "gepa", right_wrong(), system_prompt=gepa))
    assert verdict.state == "not a baseline"
    assert verdict.subject == ("an evaluation of scripted with the best prompt of GEPA run gepa-xyz instead of the "
                               "environment's")
    own = SystemPrompt(SYSTEM_PROMPT + "\n", tmp_path / "own.txt")
    same = read_back(evaluate(tmp_path / "own", right_wrong(), system_prompt=own))
    assert same.state == "ready"
    assert same.subject == "the base model scripted with the environment's system prompt (given as a file)"


def test_no_reward_at_all_lists_what_to_try(tmp_path: Path) -> None:
    """The model answers without the tags (the issue's "4 + 5 = 9"): nothing scores, so the verdict says what to
    try; the environment's own prompt names the tags already, another prompt gets the parser's format hint."""
    verdict = read_back(evaluate(tmp_path / "zero", ["4 + 5 = 9"] * 6))
    assert verdict.state == "not ready"
    assert verdict.problems == ["mean reward 0.000: no rollout got any reward, so RL has nothing to reinforce"]
    partial, hint, tokens, model = verdict.to_try
    assert partial.startswith("give partial credit in the reward")
    assert hint.startswith("show the format in the system prompt with a whole worked answer: it already names the "
                           "parser's tags (<answer>)")
    assert tokens == "raise max_tokens if answers need more room (it was 256; 0 of 6 completions were cut by it)"
    assert model == "or start from a stronger model (-m)"
    assert "to try, as no rollout got any reward:" in verdict.lines()

    terse = SystemPrompt("Answer.", tmp_path / "terse.txt")
    other = read_back(evaluate(tmp_path / "terse", ["4 + 5 = 9"] * 6, system_prompt=terse))
    assert other.state == "not a baseline"
    assert other.to_try[1] == ("add a format hint to the system prompt (try it with --system-prompt-file FILE); the "
                               "environment's parser expects:\nRespond in this format:\n<answer>\n...\n</answer>")
    assert "      <answer>" in other.lines()  # the hint's lines, indented under its item


def test_completions_cut_at_max_tokens_are_counted(tmp_path: Path, builtin_server: Any) -> None:
    """A real model with room for 3 tokens: its completions are cut (the endpoint says `length`), none scores."""
    result = evaluate(tmp_path / "cut", [], n=2, r=2, base_url=builtin_server.base_url,
                      model=builtin_server.model_name, max_tokens=3)
    verdict = read_back(result)
    rows = [json.loads(line) for line in (result.output_dir / "results.jsonl").read_text().splitlines()]
    cut = sum(r["is_truncated"] for r in rows)
    assert cut >= 3 and all(r["reward"] == 0 for r in rows)  # a random model may end one early, rarely two
    assert f"{cut} of 4 completions were cut at max_tokens (3): raise it (-t)" in verdict.problems
    assert f"raise max_tokens (it was 3; {cut} of 4 completions were cut by it), e.g. -t 6" in verdict.to_try


def test_a_folder_without_results_has_no_verdict(tmp_path: Path) -> None:
    with pytest.raises(ReadinessError, match="no metadata.json in .*: the evaluation has not finished"):
        read_readiness(tmp_path)


def test_failed_rollouts_are_counted_once_by_the_side_that_failed() -> None:
    """Rows as results.jsonl holds them: the failed ones counted once (errors) and by side: their `error_source`,
    a time limit by its error, and a row written before `error_source` that failed without stopping on an error by
    its scorer; a row that does not say is counted, under no side."""
    from prime_lab.envs.environment import TIMED_OUT
    from prime_lab.evals.readiness import RewardStats

    def row(error: str | None, stop: str = "error", **source: str | None) -> dict[str, Any]:
        return {"task": "t", "example_id": 0, "reward": 0.0, "error": error, "stop_condition": stop, **source}

    scorer = [row("reward function f raised", "completed", error_source="scorer"), row("reward f raised", "completed")]
    stats = RewardStats.from_rows([*scorer, row(None, "completed"), row(None, "completed", error_source=None)])
    assert (stats.errors, stats.failed_where()) == (2, "2 in the scorer: a reward function raised")
    mixed = RewardStats.from_rows([*scorer, row(f"{TIMED_OUT} 1 s", error_source="model"),
                                   row("x", error_source="environment"), row("y")])
    assert stats.error_sources == {"scorer": 2} and mixed.errors == 5
    assert mixed.failed_where() == "1 in the environment, 2 in the scorer, 1 past the time limit"
