"""The readiness verdict as `prime eval run` prints it, and as `prime eval get` shows it again (text and
`-o json`): real evaluations against a scripted endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prime_lab.runs.registry import RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.support.cli import prime


def gsm8k_answers(n: int) -> list[str]:
    from prime_lab.envs import load_environment

    return [f"<answer>{r['answer']}</answer>" for r in load_environment("gsm8k", difficulty="easy").get_eval_dataset(n)]


def eval_run(cwd: Path, replies: list[str], *extra: str) -> list[str]:
    """`prime eval run gsm8k` (easy, 3 examples x 2 rollouts, one at a time): its stdout's lines."""
    with scripted_endpoint(list[str | None | dict[str, Any]](replies)) as ep:
        proc = prime("eval", "run", "gsm8k", "-b", ep.base_url, "-m", "scripted", "-n", "3", "-r", "2", "-c", "1",
                     "-a", '{"difficulty": "easy"}', *extra, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_run_and_get_print_one_verdict_each_reason_a_pass_or_a_problem(tmp_path: Path) -> None:
    first = gsm8k_answers(1)[0]
    lines = eval_run(tmp_path, [first, first] + ["<answer>-1</answer>"] * 4)
    assert "avg reward 0.333 (the mean of all 6 rollouts)  correct_answer 0.333" in lines
    start = lines.index("verdict: not ready for RL (the base model scripted with the environment's system prompt)")
    verdict = lines[start:start + 3]
    assert verdict[1] == "  pass     mean reward 0.333 is above 0 and below 0.8: there is room to learn"
    assert verdict[2].startswith("  problem  100% of examples got one reward on every rollout")
    assert lines[start + 3].startswith("results: ")
    assert not any("ready for RL" in line for line in lines[:start] + lines[start + 1:])  # one verdict, said once

    [run] = RunRegistry().runs()
    shown = prime("eval", "get", run.id).stdout.splitlines()
    assert shown[-3:] == verdict  # the same verdict, read back from the files
    facts = json.loads(prime("eval", "get", run.id, "-o", "json").stdout)
    assert facts["id"] == run.id and facts["kind"] == "eval"
    readiness = facts["readiness"]
    assert (readiness["state"], readiness["headline"]) == ("not ready", "not ready for RL")
    assert [(c["label"], c["text"]) for c in readiness["checks"]] == [
        ("pass", verdict[1].split("pass     ", 1)[1]), ("problem", verdict[2].split("problem  ", 1)[1])]
    assert readiness["to_try"] == [] and readiness["instead"] is None


def test_an_evaluation_with_another_prompt_is_not_a_baseline_and_a_zero_reward_says_what_to_try(
        tmp_path: Path) -> None:
    (tmp_path / "prompt.txt").write_text("Answer.\n")
    lines = eval_run(tmp_path, ["4 + 5 = 9"] * 6, "--system-prompt-file", "prompt.txt")
    prompt = (tmp_path / "prompt.txt").resolve()
    start = lines.index(f"verdict: not a baseline (an evaluation of scripted with the system prompt in {prompt} "
                        "instead of the environment's)")
    assert lines[start + 1] == ("  for the verdict on RL, evaluate the base model with the environment's own prompt: "
                                "`prime eval run gsm8k -m scripted` (with the same -a, -n and -r); the checks below "
                                "are of this policy")
    assert lines[start + 2] == "  problem  mean reward 0.000: no rollout got any reward, so RL has nothing to reinforce"
    tries = lines[lines.index("to try, as no rollout got any reward:") + 1:-1]
    assert tries[0].startswith("  - give partial credit in the reward")
    assert tries[1:6] == ["  - add a format hint to the system prompt (try it with --system-prompt-file FILE); the "
                          "environment's parser expects:", "      Respond in this format:", "      <answer>",
                          "      ...", "      </answer>"]
    assert tries[6] == "  - raise max_tokens if answers need more room (it was 256; 0 of 6 completions were cut by it)"
    assert not any("baseline reward" in line for line in lines)


def test_get_of_an_unfinished_evaluation_says_it_has_no_verdict_yet() -> None:
    run = RunRegistry().create("eval", config_text="{}", resolved={}, model="m", envs=["gsm8k"])
    proc = prime("eval", "get", run.id)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "verdict: none yet (no results yet)"
    assert json.loads(prime("eval", "get", run.id, "-o", "json").stdout)["readiness"] is None
