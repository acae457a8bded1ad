"""Every built-in environment evaluates end to end against the real built-in server (tiny model; SmolLM2 slow)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import RunRegistry
from tests.support import cli

prime = partial(cli.prime, timeout=600)
ENVS = ["reverse-text", "alphabet-sort", "gsm8k", "wordle", "math-python", "code-tests"]
# Multi-turn environments capped at two model turns in the SmolLM2 tests, to keep CI time down.
SHORT_ARGS = {"alphabet-sort": '{"min_turns": 2, "max_turns": 2}', "wordle": '{"max_turns": 2}',
              "math-python": '{"max_turns": 2}'}


def results(run_id: str) -> list[dict[str, Any]]:
    out = Path(RunRegistry().get(run_id).status()["output_dir"])
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("env", ENVS)
def test_builtin_env_against_the_builtin_server(env: str, builtin_server: Any, tmp_path: Path,
                                                lab_home: Path) -> None:
    proc = prime("eval", "run", env, "-b", builtin_server.base_url, "-m", builtin_server.model_name, "-n", "2",
                 "-r", "2", "-t", "12", "-S", '{"seed": 1}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    rows = results(run.id)
    assert len(rows) == 4
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert all(r["completion"] and r["completion"][0]["role"] == "assistant" for r in rows)
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    assert all(r["token_usage"]["completion_tokens"] > 0 for r in rows)


def test_eval_starts_and_stops_its_own_sampler(tiny_model_dir: Path, tmp_path: Path, lab_home: Path) -> None:
    proc = prime("eval", "run", "reverse-text", "-m", str(tiny_model_dir), "-n", "2", "-r", "2", "-t", "8",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["state"] == "completed"
    assert not run.live_processes()  # the sampler it started is gone
    assert run.log_path("inference").exists()
    assert len(results(run.id)) == 4


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVS)
def test_every_builtin_env_with_smollm2(env: str, builtin_smollm2_server: Any, tmp_path: Path, lab_home: Path) -> None:
    proc = prime("eval", "run", env, "-b", builtin_smollm2_server.base_url, "-m", "smollm2-135m", "-n", "1", "-r", "2",
                 "-t", "24", "-a", SHORT_ARGS.get(env, "{}"), cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    rows = results(run.id)
    assert len(rows) == 2 and all(r["error"] is None for r in rows)
    assert all(r["completion"][0]["content"].strip() for r in rows)  # the real model says something


@pytest.mark.slow
def test_default_model_is_smollm2_served_locally(smollm2_dir: Path, tmp_path: Path, lab_home: Path) -> None:
    proc = prime("eval", "run", "primeintellect/reverse-text", "-n", "1", "-r", "2", "-t", "24", cwd=tmp_path,
                 timeout=900)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    assert run.status()["model"] == "smollm2-135m"
    rows = results(run.id)
    assert len(rows) == 2 and all(r["error"] is None for r in rows)
    assert any(r["reward"] > 0 for r in rows)  # the real model reverses at least a little


def test_rollouts_keep_the_rl_fields_per_turn(builtin_server: Any) -> None:
    """Multi-turn rollouts through the real server keep each turn's token ids and the sampler's logprobs."""
    import asyncio

    from openai import AsyncOpenAI

    from prime_lab.envs import EnvGroup, SamplingArgs, load_environment

    group = EnvGroup([load_environment("alphabet-sort", min_turns=2, max_turns=2),
                      load_environment("reverse-text")])
    rows = group.get_eval_dataset()
    picked = [next(r for r in rows if r["task"] == task) for task in ("alphabet-sort", "reverse-text")]
    client = AsyncOpenAI(base_url=builtin_server.base_url, api_key="x", max_retries=0)
    sampling = SamplingArgs(max_tokens=6, temperature=1.0, rl_fields=True)
    multi, single = asyncio.run(group.run_rollouts(client, builtin_server.model_name, picked, sampling))
    assert multi.task == "alphabet-sort" and len(multi.turns) == 2
    assert single.task == "reverse-text" and len(single.turns) == 1
    for turn in multi.turns + single.turns:
        assert turn.prompt_token_ids and turn.completion_token_ids and turn.completion_logprobs
        assert len(turn.completion_token_ids) == len(turn.completion_logprobs) <= 6
        assert all(lp <= 0.0 for lp in turn.completion_logprobs)
    # The second turn's prompt holds the first turn's prompt and completion, then the environment's message.
    first, second = multi.turns
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
    assert len(second.prompt_token_ids) > len(first.prompt_token_ids) + len(first.completion_token_ids)
