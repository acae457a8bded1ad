"""`prime gepa export RUN --rl`: an RL config that starts from a GEPA run's best prompt, through `[[env]].args` when
the environment takes `system_prompt`, else through the local `[[env]] system_prompt`; and an RL run of it trains on
rows whose system message is that prompt."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.config import validate_rl_file
from tests.support.cli import prime
from tests.support.rl_runs import fixture_envs, logs, start, wait_final

__all__ = ["fixture_envs"]  # autouse: `prime` finds the tiny-chars environment
BEST = "Answer with letters only.\nNever digits."


def gepa_run(env_id: str, model: str, env_args: dict | None = None) -> Run:
    settings = {"env_id": env_id, "env_args": env_args or {}, "model": model, "num_val": 4,
                "sampling": {"max_tokens": 8, "temperature": 0.9}}
    run = RunRegistry().create("gepa", config_text="", resolved={"settings": settings}, model=model, envs=[env_id])
    run.gepa_dir.mkdir()
    (run.gepa_dir / "best_prompt.txt").write_text(BEST)
    (run.gepa_dir / "metadata.json").write_text(json.dumps({"best_score": 0.75, "best_idx": 1}))
    (run.gepa_dir / "candidates.jsonl").write_text(json.dumps({"candidate_idx": 0, "score": 0.5}) + "\n"
                                                   + json.dumps({"candidate_idx": 1, "score": 0.75}) + "\n")
    return run


def test_an_environment_with_a_system_prompt_argument_gets_it_in_args(tmp_path: Path) -> None:
    run = gepa_run("reverse-text", "smollm2-135m", {"max_words": 2})
    out = tmp_path / "rl.toml"
    proc = prime("gepa", "export", run.id, "--rl", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "takes system_prompt" in proc.stderr and f"prime rl run @{out}" in proc.stderr
    data = tomllib.loads(out.read_text())
    assert data["env"][0]["args"] == {"max_words": 2, "system_prompt": BEST} and "system_prompt" not in data["env"][0]
    assert data["model"] == "smollm2-135m" and data["sampling"] == {"max_tokens": 8, "temperature": 0.9}
    assert "validation reward 0.750, seed prompt 0.500" in out.read_text()
    result = validate_rl_file(out)
    assert result.problems == [], [p.format() for p in result.problems]  # the same file runs on Hosted Training
    again = prime("gepa", "export", run.id, "--rl", "-o", str(out))
    assert again.returncode == 1 and "--force" in again.stderr
    printed = prime("gepa", "export", run.id, "--rl")
    assert printed.returncode == 0 and tomllib.loads(printed.stdout) == data


def test_refusals_say_why(tmp_path: Path) -> None:
    rl = RunRegistry().create("rl", config_text="", resolved={}, max_steps=1)
    assert "is not a GEPA run" in prime("gepa", "export", rl.id, "--rl").stderr
    empty = gepa_run("reverse-text", "smollm2-135m")
    (empty.gepa_dir / "best_prompt.txt").unlink()
    assert "no best_prompt.txt yet" in prime("gepa", "export", empty.id, "--rl").stderr
    assert "--rl" in prime("gepa", "export", empty.id).stderr


@pytest.mark.slow
def test_without_the_argument_the_rl_run_replaces_each_rows_system_message(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    run = gepa_run("tiny-chars", str(tiny_model_dir))
    out = tmp_path / "rl.toml"
    proc = prime("gepa", "export", run.id, "--rl", "-o", str(out), "--max-steps", "1")
    assert proc.returncode == 0 and "takes no system_prompt argument" in proc.stderr, proc.stderr
    result = validate_rl_file(out)
    assert result.ok and [p.key for p in result.notes] == ["env[0].system_prompt"]
    text = out.read_text().replace('[eval]', '[inference]\nbackend = "builtin"\n\n[eval]')
    out.write_text(text.replace("num_examples = 20", "num_examples = 2"))
    rl = start(out)
    assert wait_final(rl)["state"] == "completed", logs(rl)
    batch = [json.loads(line) for line in (rl.rollouts_dir / "step_1.jsonl").read_text().splitlines()]
    assert {s["prompt"][0]["content"] for s in batch} == {BEST}
    assert all(s["prompt"][0]["role"] == "system" for s in batch)
