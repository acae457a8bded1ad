"""Environments written against the real verifiers package run in prime-lab unchanged: `prime eval run` of each
against the built-in server, a 2-step `prime rl run` of each (one run mixing two), `prime gepa run` of one, and
the same environments under the oldest supported verifiers release (installed beside us in a throwaway folder).

The environments are tests/fixtures/verifiers_envs/ (what each is modelled on: its README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.envs.scripted import scripted_endpoint
from tests.envs.verifiers_standins import completion, env_path, tool_calling_model
from tests.gepa.reflection_standin import write_gepa_config
from tests.support import cli
from tests.support.rl_runs import logs, metrics, start, wait_final, write_envs_config

prime = partial(cli.prime, timeout=600)
OLDEST = "0.1.12"  # the oldest release of pyproject.toml's `verifiers` extra
pytestmark = pytest.mark.slow

# Each environment with the arguments its tests use (alphabet sort: the similarity itself, not its 4th power, so
# that a random model's reward shows).
ENV_ARGS: dict[str, dict[str, Any]] = {"vf-reverse-text": {}, "vf-alphabet-sort": {"similarity_power": 1},
                                       "vf-mastermind": {"max_turns": 3}}


@pytest.fixture(autouse=True)
def verifiers_envs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The run's processes find the environments as installed modules; datasets stay offline."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [env_path(), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def eval_rows(cwd: Path) -> list[dict[str, Any]]:
    [results] = list((cwd / "outputs" / "evals").rglob("results.jsonl"))
    return [json.loads(line) for line in results.read_text().splitlines()]


@pytest.mark.parametrize("env_id", list(ENV_ARGS))
def test_eval_run(env_id: str, builtin_server: Any, tmp_path: Path) -> None:
    proc = prime("eval", "run", env_id, "-b", builtin_server.base_url, "-m", builtin_server.model_name, "-n", "2",
                 "-r", "2", "-t", "8", "-a", json.dumps(ENV_ARGS[env_id]), "-S", '{"seed": 3}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert len(rows) == 4
    assert [r["error"] for r in rows] == [None] * 4
    assert sum(r["reward"] for r in rows) > 0, [r["metrics"] for r in rows]  # a random model earns something
    assert all(r["completion"][0]["role"] == "assistant" and r["token_usage"]["completion_tokens"] > 0 for r in rows)
    names = {"vf-reverse-text": {"lcs_reward_func", "format_reward_func"},
             "vf-alphabet-sort": {"sorted_names_reward"},
             "vf-mastermind": {"solved_reward", "partial_credit", "format_reward_func"}}[env_id]
    assert all(names <= set(r["metrics"]) for r in rows), rows[0]["metrics"]  # the rubric's per-function metrics
    if env_id == "vf-reverse-text":  # its system prompt reached the model, ahead of the row's own prompt
        assert rows[0]["prompt"][0]["content"].startswith("Reverse the text character-by-character")
    else:  # multi-turn: the environment's own env_response answered between model turns
        assert max(len(r["turns"]) for r in rows) >= 2
        assert any(m["role"] == "user" for r in rows for m in r["completion"])


@pytest.fixture
def tool_endpoint() -> Iterator[Any]:
    with scripted_endpoint([]) as endpoint:
        def reply(request: dict[str, Any]) -> dict[str, Any]:
            endpoint.requests.append(request)
            return completion(request, tool_calling_model(request))

        endpoint.next_reply = reply
        yield endpoint


def test_tool_env_eval_run(tool_endpoint: Any, tmp_path: Path) -> None:
    """verifiers' ToolEnv sends its tools natively and runs the calls (a stand-in model that always calls one: a
    small random model rarely does)."""
    proc = prime("eval", "run", "vf-tool-test", "-b", tool_endpoint.base_url, "-m", "stand-in", "-n", "4", "-r", "1",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert [r["error"] for r in rows] == [None] * 4
    for row in rows:
        roles = [m["role"] for m in row["completion"]]
        assert roles == ["assistant", "tool", "assistant"], row["completion"]
        wanted = row["info"]["tool_names"]
        assert row["reward"] == pytest.approx(1 / len(wanted))  # one of the tools asked for
        assert row["metrics"][f"{wanted[0]}_calls"] == 1.0  # ToolEnv's own per-tool metric


def test_tool_env_on_the_builtin_server(builtin_server: Any, tmp_path: Path) -> None:
    """The built-in server takes verifiers' native `tools` (it refused them once, failing every rollout)."""
    proc = prime("eval", "run", "vf-tool-test", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "2", "-r", "2", "-t", "8", "-S", '{"seed": 3}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert len(rows) == 4 and [r["error"] for r in rows] == [None] * 4, [r["error"] for r in rows]
    assert all(r["completion"][0]["role"] == "assistant" and r["token_usage"]["completion_tokens"] > 0 for r in rows)


def test_an_environment_for_another_release_says_so(tmp_path: Path) -> None:
    """vf-old-api is written for verifiers 0.1.5; the installed release cannot run it, and the error says why."""
    proc = prime("eval", "run", "vf-old-api", "-b", "http://127.0.0.1:9/v1", "-m", "none", "-n", "2", "-r", "1",
                 cwd=tmp_path)
    assert proc.returncode != 0
    assert "is installed (prime-lab supports verifiers>=0.1.12,<0.4)" in proc.stderr
    assert "environment 'vf_old_api' declares verifiers>=0.1.3,<0.1.6" in proc.stderr


@pytest.mark.parametrize("env_ids", [["vf-reverse-text", "vf-alphabet-sort"], ["vf-mastermind"]],
                         ids=["mixed", "mastermind"])
def test_rl_run(env_ids: list[str], learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_envs_config(tmp_path / "rl.toml", learnable_model_dir, {e: ENV_ARGS[e] for e in env_ids}))
    status = wait_final(run, timeout=500)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    samples = [json.loads(line) for step in (1, 2)
               for line in (run.rollouts_dir / f"step_{step}.jsonl").read_text().splitlines()]
    assert {s["env"] for s in samples} == set(env_ids)
    for sample in samples:  # the sampler's token ids and logprobs reached the trainer, through verifiers
        assert len(sample["input_ids"]) == len(sample["loss_mask"]) == len(sample["sampler_logprobs"])
        completion_logprobs = [lp for lp, m in zip(sample["sampler_logprobs"], sample["loss_mask"], strict=True) if m]
        assert completion_logprobs and all(lp < 0 for lp in completion_logprobs)
    if len(env_ids) == 2:
        by_step = metrics(run, "orchestrator")
        assert {f"reward/{e}" for e in env_ids} <= {k for m in by_step.values() for k in m}
    assert any(s["reward"] > 0 for s in samples)
    multi_turn = [s for s in samples if s["env"] != "vf-reverse-text"]
    assert any(m["role"] == "user" for s in multi_turn for m in s["completion"])  # env_response's turns


def test_gepa_run(builtin_server: Any, tmp_path: Path) -> None:
    """GEPA optimizes a verifiers environment's system prompt (the guide's flow: seed = the environment's own)."""
    proposals = [f"```\nReverse the text (attempt {i}). Answer in <reversed_text> tags.\n```" for i in range(20)]
    with scripted_endpoint(proposals) as reflection:
        config = write_gepa_config(tmp_path / "gepa.toml", builtin_server, reflection, "vf-reverse-text",
                                   max_calls=16, num_train=4, num_val=3, seed=1)
        proc = prime("gepa", "run", f"@{config}", "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run" / "gepa"
    meta = json.loads((out / "metadata.json").read_text())
    assert 0 < meta["total_metric_calls"] <= 16
    candidates = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    assert candidates[0]["texts"]["system_prompt"].startswith("Reverse the text character-by-character")
    # the reflection model saw the environment's real rollouts: the rubric's reward and the model's replies
    shown = reflection.requests[0]["messages"][0]["content"]
    assert "Generated Outputs" in shown and "lcs_reward_func" in shown
    assert (out / "best_prompt.txt").read_text() == candidates[meta["best_idx"]]["texts"]["system_prompt"]


# The oldest supported release -------------------------------------------------------------------------------

OLDEST_CHECK = r'''
import asyncio, json, sys
import verifiers
from openai import AsyncOpenAI
from prime_lab.envs import SamplingArgs, load_environment

async def main(base_url, model, tool_url, env_args):
    out = {"verifiers": verifiers.__file__}
    for env_id, args in env_args.items():
        url, name = (tool_url, "stand-in") if env_id == "vf-tool-test" else (base_url, model)
        client = AsyncOpenAI(base_url=url, api_key="x")
        env = load_environment(env_id, **args)
        sampling = SamplingArgs(max_tokens=8, seed=1, rl_fields=True)
        rollouts = await env.run_rollouts(client, name, env.get_eval_dataset(2), sampling, rollouts_per_example=2)
        out[env_id] = [{"reward": r.reward, "error": r.error, "roles": [m["role"] for m in r.completion],
                        "tokens": [t.completion_token_ids is not None
                                   and len(t.completion_token_ids) == len(t.completion_logprobs or [])
                                   for t in r.turns]} for r in rollouts]
    print("RESULT " + json.dumps(out))

asyncio.run(main(*sys.argv[1:4], json.loads(sys.argv[4])))
'''


@pytest.fixture(scope="session")
def oldest_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verifiers==OLDEST in a folder of its own, put first on PYTHONPATH (everything else: the .venv's)."""
    target = tmp_path_factory.mktemp("verifiers-oldest")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           f"verifiers=={OLDEST}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return target


def test_oldest_supported_release(oldest_release: Path, builtin_server: Any, tool_endpoint: Any,
                                  tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(oldest_release), os.environ["PYTHONPATH"]])}
    args = {**ENV_ARGS, "vf-tool-test": {}}
    proc = subprocess.run([sys.executable, "-c", OLDEST_CHECK, builtin_server.base_url, builtin_server.model_name,
                           tool_endpoint.base_url, json.dumps(args)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result.pop("verifiers").startswith(str(oldest_release))  # the oldest release ran, not the .venv's
    for env_id, rollouts in result.items():
        assert len(rollouts) == 4 and [r["error"] for r in rollouts] == [None] * 4, (env_id, rollouts)
        assert all(r["tokens"] and all(r["tokens"]) for r in rollouts), (env_id, rollouts)
        assert sum(r["reward"] for r in rollouts) > 0, (env_id, rollouts)
    assert all(r["roles"] == ["assistant", "tool", "assistant"] for r in result["vf-tool-test"])
    # the adapter's unit tests (conversions, stop conditions, tool calls, GEPA's prompts, failures) under it
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(Path(__file__).parents[1] / "envs" / "test_verifiers_adapter.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:]
    # and the CLI under it
    proc = prime("eval", "run", "vf-alphabet-sort", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "2", "-r", "1", "-t", "8", "-a", '{"similarity_power": 1}', "-S", '{"seed": 3}', cwd=tmp_path,
                 env=env)  # seeded as test_eval_run: an unseeded draw can end at once (verifiers' empty-response error)
    assert proc.returncode == 0, proc.stderr
    assert [r["error"] for r in eval_rows(tmp_path)] == [None, None]
