"""Releases before `run_group` (verifiers 0.1.5 - 0.1.7) driven end to end: a real `driver.py describe` and
`driver.py serve` process in an interpreter of such a release, a real tiny model behind the built-in server.

The interpreter is a small virtual environment made once per session (no pip, ~0.1 s): the project's packages
(openai, pyzmq, msgpack) through a `.pth` file after its own site-packages, and before them a stand-in for verifiers
0.1.7, shaped as that release is (no `run_group`, no server of its own; `Rubric(funcs, weights, parser, **kwargs)`
keeping an unknown keyword as an attribute; `init_state`, `rollout(...) -> (completion, state)` keeping the model's
responses in the state; `rubric.score_rollout(...) -> RolloutScore`; `get_reward_funcs()`), and an environment
shaped as gpu_puzzles is (its `info` JSON text, `vf.Rubric(parser=..., reward_funcs=[...])`, and an event loop
run with `asyncio.get_event_loop().run_until_complete` while it loads). And, in process, the arguments a rollout of
0.1.5's shape (no `init_state`, a rollout without completion, state or example id) is called with. And two
environments judged by an LLM (envs/judges.py), one taking judge arguments and one building its client from
OPENAI_BASE_URL, wired to the run's judge in that interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prime_lab.envs import SamplingArgs, driver, isolated, load_environment
from prime_lab.envs.env_server import run_driver
from prime_lab.envs.isolated import IsolatedEnvironment, IsolatedRecord
from prime_lab.envs.judges import JudgeEndpoint
from tests.envs.test_judge_wiring import requests_answered
from tests.envs.verifiers_standins import release_interpreter
from tests.plugins.servers import TINY_SERVED_NAME
from tests.support import cli

STAND_IN_VERIFIERS = '''\
"""A stand-in for verifiers 0.1.7: its Rubric, SingleTurnEnv and load_environment, as that release has them."""
import importlib
import time


class RolloutScore:
    def __init__(self, reward, metrics):
        self.reward, self.metrics = reward, metrics


class Parser:
    def get_format_str(self):
        return "plain text"


class Rubric:
    def __init__(self, funcs=None, weights=None, parser=None, parallelize_scoring=True, **kwargs):
        self.reward_funcs = funcs or []
        self.reward_weights = weights or []
        self.parser = parser or Parser()
        for key, value in kwargs.items():
            setattr(self, key, value)
        if not self.reward_weights:
            self.reward_weights = [1.0] * len(self.reward_funcs)

    def get_reward_funcs(self):
        return self.reward_funcs

    def get_reward_weights(self):
        return self.reward_weights

    async def score_rollout(self, prompt, completion, answer, state, task="default", info=None, example_id=None,
                            **kwargs):
        scores = [await f(prompt=prompt, completion=completion, answer=answer, state=state, task=task, info=info)
                  for f in self.reward_funcs]
        return RolloutScore(sum(s * w for s, w in zip(scores, self.reward_weights)),
                            {f.__name__: s for f, s in zip(self.reward_funcs, scores)})


class SingleTurnEnv:
    message_type = "chat"
    oai_tools = None

    def __init__(self, dataset=None, eval_dataset=None, system_prompt=None, parser=None, rubric=None, **kwargs):
        self.dataset, self.eval_dataset, self.system_prompt = dataset, eval_dataset, system_prompt
        self.parser, self.rubric = parser or Parser(), rubric or Rubric()
        self.sampling_args = {"n": 1, "extra_body": {}}

    def get_eval_dataset(self, n=-1, seed=None):
        return list(self.eval_dataset)

    async def init_state(self, prompt, completion, answer, task, info, example_id, **kwargs):
        return {"prompt": prompt, "completion": completion, "answer": answer, "task": task, "info": info,
                "example_id": example_id, "responses": [], "turn": 0,
                "timing": {"generation_ms": 0.0, "scoring_ms": 0.0, "total_ms": 0.0}}

    async def rollout(self, client, model, prompt, completion=None, answer="", state={}, task="default", info=None,
                      example_id=0, sampling_args=None, **kwargs):
        started = time.time()
        args = dict(sampling_args or {})
        args["max_completion_tokens"] = args.pop("max_tokens")
        response = await client.chat.completions.create(model=model, messages=prompt, **args)
        state["responses"].append(response)
        state["completion"].append({"role": "assistant", "content": response.choices[0].message.content or ""})
        state["turn"] += 1
        state["timing"]["generation_ms"] = state["timing"]["total_ms"] = (time.time() - started) * 1000
        return state["completion"], state


def load_environment(env_id, **kwargs):
    return importlib.import_module(env_id.replace("-", "_")).load_environment(**kwargs)
'''

PUZZLE_ENV = '''\
"""Shaped like gpu_puzzles: rows with `info` as JSON text, vf.Rubric(parser=..., reward_funcs=[...]), and an event
loop of its own run while it loads."""
import asyncio
import json

import verifiers as vf


def load_environment(**kwargs):
    async def check_auth():
        await asyncio.sleep(0)

    asyncio.get_event_loop().run_until_complete(check_auth())

    async def info_read(completion, info, **kwargs):
        return 1.0 if isinstance(info, dict) and info["name"] in ("add", "map") else 0.0

    async def answered(completion, **kwargs):
        return 1.0 if completion and completion[0]["role"] == "assistant" else 0.0

    rows = [{"prompt": [{"role": "user", "content": f"Puzzle {i}: {name}"}], "info": json.dumps({"name": name})}
            for i, name in enumerate(("add", "map"))]
    parser = vf.Parser()
    return vf.SingleTurnEnv(eval_dataset=rows, parser=parser,
                            rubric=vf.Rubric(parser=parser, reward_funcs=[info_read, answered]))
'''


# Scored by an LLM judge: the reward is the judge's answer length (at most 3 tokens, so 1-3), by the client given.
JUDGE_VERDICT = '''\
import verifiers as vf


def judged_env(judge, judge_model):
    async def verdict(completion, **kwargs):
        reply = await judge.chat.completions.create(model=judge_model, max_tokens=3, messages=[
            {"role": "user", "content": "Is this a good answer? " + completion[-1]["content"]}])
        return float(reply.usage.completion_tokens)

    rows = [{"prompt": [{"role": "user", "content": "Say one."}], "answer": "one"}]
    return vf.SingleTurnEnv(eval_dataset=rows, rubric=vf.Rubric(funcs=[verdict]))
'''

# agentic_misalignment's shape: the judge's address, model and key variable are arguments.
JUDGE_ARGS_ENV = '''\
import os

from openai import AsyncOpenAI

from judge_verdict import judged_env


def load_environment(judge_model="gpt-4.1-mini", judge_base_url="https://api.openai.com/v1",
                     judge_api_key_var="MY_JUDGE_KEY"):
    return judged_env(AsyncOpenAI(base_url=judge_base_url, api_key=os.environ[judge_api_key_var], max_retries=0),
                      judge_model)
'''

# llm_writer_negative_style's shape: a client built from OPENAI_BASE_URL / OPENAI_API_KEY, only the model an argument.
JUDGE_VARS_ENV = '''\
from openai import AsyncOpenAI

from judge_verdict import judged_env


def load_environment(judge_model="gpt-5"):
    return judged_env(AsyncOpenAI(max_retries=0), judge_model)
'''


@pytest.fixture(scope="session")
def classic_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter of verifiers 0.1.7 (the stand-in) with the puzzle and the judged environments installed."""
    return release_interpreter(tmp_path_factory.mktemp("classic-venv"), "0.1.7",
                               {"verifiers/__init__.py": STAND_IN_VERIFIERS, "puzzle_env.py": PUZZLE_ENV,
                                "judge_verdict.py": JUDGE_VERDICT, "judge_args_env.py": JUDGE_ARGS_ENV,
                                "judge_vars_env.py": JUDGE_VARS_ENV})


@pytest.fixture
def servers_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Servers log into this test's folder and end with the test."""
    monkeypatch.setattr(isolated, "_context", dict(isolated._context))
    isolated.serve_into(tmp_path / "logs")
    yield tmp_path / "logs"
    isolated.stop_servers()


def test_a_release_without_run_group_is_described_and_driven(classic_python: Path, servers_here: Path,
                                                             builtin_server: Any, tmp_path: Path) -> None:
    """describe: its rows as its dataset keeps them, its reward functions by `get_reward_funcs()` with their weights.
    serve: a group of two rollouts through prime-lab's driver, each scored by the rubric with its `info` read from
    JSON, with the trajectory RL needs (the model call's prompt and completion token ids and one logprob per
    completion token, from the real server's response) and the finish reason."""
    record = IsolatedRecord(name="puzzle-env", module="puzzle_env", distribution="puzzle-env", version="0.1",
                            release="0.1.7", python=str(classic_python), target=str(tmp_path), reason="a test's")
    env = IsolatedEnvironment(record, "puzzle-env", {})
    assert env.release == "0.1.7"
    assert [f.__name__ for f in env.rubric.funcs] == ["info_read", "answered"] and env.rubric.weights == [1.0, 1.0]
    rows = env.get_eval_dataset()
    assert [r["info"] for r in rows] == [{"name": "add"}, {"name": "map"}]
    model = SimpleNamespace(base_url=builtin_server.base_url, api_key="EMPTY")
    rollouts = asyncio.run(env.run_group(model, builtin_server.model_name, rows, SamplingArgs(max_tokens=8,
                                                                                             rl_fields=True)))
    assert [r.error for r in rollouts] == [None, None]
    assert [(r.reward, r.metrics) for r in rollouts] == [(2.0, {"info_read": 1.0, "answered": 1.0})] * 2
    assert "prime-lab's driver" in (servers_here / "env-puzzle-env.log").read_text()
    for rollout in rollouts:
        [turn] = rollout.turns
        assert turn.prompt_token_ids and turn.completion_token_ids and turn.completion_logprobs
        assert 0 < len(turn.completion_token_ids) <= 8
        assert len(turn.completion_logprobs) == len(turn.completion_token_ids)
        assert turn.finish_reason in ("stop", "length") and rollout.is_truncated == (turn.finish_reason == "length")
        assert rollout.completion[0]["role"] == "assistant" and rollout.timing["generation_ms"] > 0


def test_judged_environments_are_wired_to_the_judge_in_their_own_interpreter(
        classic_python: Path, servers_here: Path, builtin_server: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the run's judge in this process's environment (the session's server, as a run's orchestrator is given
    one), each installed environment is loaded wired to it: the judge arguments it takes filled in (read from its
    signature in its own interpreter), OPENAI_BASE_URL / OPENAI_API_KEY in its server's environment for the one that
    reads them (never in this process). Its rollouts' rewards are the judge's answers."""
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MY_JUDGE_KEY"):
        monkeypatch.delenv(variable, raising=False)
    endpoint = JudgeEndpoint(builtin_server.base_url, TINY_SERVED_NAME)
    for name, value in endpoint.environ().items():
        monkeypatch.setenv(name, value)
    for module in ("judge_args_env", "judge_vars_env"):
        checked = run_driver(classic_python, "check", module)  # what `prime env install` records
        assert checked.get("ok"), checked
        isolated.save_record(IsolatedRecord(
            name=module.replace("_", "-"), module=module, distribution=module, version="0.1", release="0.1.7",
            python=str(classic_python), target=str(tmp_path), reason="a test's",
            args=tuple(tuple(a) for a in checked["args"])))
    # `prime env list` says how a judge reaches each (the column shows where one here takes a judge)
    listed = cli.prime("env", "list", env={**os.environ, "COLUMNS": "240"})
    assert "JUDGE WIRED BY" in listed.stdout, listed.stdout
    wired = {row["id"]: row["judge"] for row in json.loads(cli.prime("env", "list", "--output", "json").stdout)}
    assert wired["judge-args-env"] == "judge_base_url, judge_model, judge_api_key_var"
    assert wired["judge-vars-env"] == "judge_model + OPENAI_BASE_URL"
    by_arguments, by_variables = load_environment("judge-args-env"), load_environment("judge-vars-env")
    assert isinstance(by_arguments, IsolatedEnvironment) and isinstance(by_variables, IsolatedEnvironment)
    assert by_arguments.judge_wiring == (f"environment 'judge-args-env': judge {TINY_SERVED_NAME} at "
                                         f"{builtin_server.base_url} through judge_base_url, judge_model, "
                                         "judge_api_key_var (arguments)")
    assert by_variables.judge_wiring is not None and \
        "judge_model (arguments) and OPENAI_API_KEY, OPENAI_BASE_URL (its environment)" in by_variables.judge_wiring
    assert "OPENAI_BASE_URL" not in os.environ and "OPENAI_API_KEY" not in os.environ
    model = SimpleNamespace(base_url=builtin_server.base_url, api_key="EMPTY")
    for env in (by_arguments, by_variables):
        before = requests_answered(builtin_server.root_url)
        rows = env.get_eval_dataset()
        rollouts = asyncio.run(env.run_group(model, TINY_SERVED_NAME, rows * 2, SamplingArgs(max_tokens=4)))
        assert [r.error for r in rollouts] == [None, None]
        assert all(1.0 <= r.reward <= 3.0 for r in rollouts), [r.reward for r in rollouts]
        assert requests_answered(builtin_server.root_url) - before == 4  # each rollout: the policy, then the judge


class Release015Env:
    """0.1.5's shape: no init_state; rollout(client, model, prompt, answer, task, info, sampling_args) builds its
    own state; a response kept as the model's JSON (token ids and logprobs as vLLM returns them)."""

    message_type = "chat"
    oai_tools = [{"type": "function", "function": {"name": "add"}}]

    def __init__(self) -> None:
        self.rubric = SimpleNamespace(score_rollout=self.score_rollout)
        self.calls: list[dict[str, Any]] = []

    async def rollout(self, client: Any, model: str, prompt: list[dict[str, Any]], answer: str = "",
                      task: str = "default", info: dict[str, Any] | None = None,
                      sampling_args: dict[str, Any] | None = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.calls.append({"answer": answer, "task": task, "info": info, "sampling_args": sampling_args, **kwargs})
        response = {"prompt_token_ids": [1, 2, 3], "choices": [{"token_ids": [7, 8], "finish_reason": "length",
                                                                "logprobs": {"content": [{"logprob": -0.5},
                                                                                         {"logprob": -1.5}]}}]}
        completion = [{"role": "assistant", "content": "4"}]
        return completion, {"id": 0, "responses": [response], "timing": {"generation_ms": 5.0}}

    async def score_rollout(self, prompt: Any, completion: Any, answer: str, state: dict[str, Any],
                            task: str = "default", info: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        self.calls.append({"scored": kwargs})
        return SimpleNamespace(reward=0.5, metrics={"exact": 0.5})


def test_a_0_1_5_shaped_rollout_gets_only_the_arguments_it_names() -> None:
    """No init_state, no completion/state/example_id parameters: the rollout gets answer, task, its info read from
    JSON with the environment's tools put in, and a copy of the sampling arguments; the scorer no example id (its
    **kwargs would pass it to the reward functions). The output has the row's fields, the score, and the trajectory
    step from the response (its tokens, its finish reason, truncation)."""
    env = Release015Env()
    sampling = {"max_tokens": 8}
    row = {"prompt": [{"role": "user", "content": "2+2"}], "answer": "4", "info": '{"level": 1}', "example_id": 3}
    out = asyncio.run(driver.classic_rollout(env, row, None, "m", sampling, ["trajectory"]))
    assert env.calls == [{"answer": "4", "task": "default", "info": {"level": 1, "oai_tools": env.oai_tools},
                          "sampling_args": {"max_tokens": 8}}, {"scored": {}}]
    assert env.calls[0]["sampling_args"] is not sampling
    assert (out["example_id"], out["reward"], out["metrics"], out["is_truncated"]) == (3, 0.5, {"exact": 0.5}, True)
    assert out["trajectory"] == [{"prompt": row["prompt"], "completion": [{"role": "assistant", "content": "4"}],
                                  "response": {"message": {"finish_reason": "length"}},
                                  "tokens": {"prompt_ids": [1, 2, 3], "prompt_mask": [0, 0, 0],
                                             "completion_ids": [7, 8], "completion_mask": [1, 1],
                                             "completion_logprobs": [-0.5, -1.5]}}]
