"""The environment protocol: rubric calling conventions and failures, rollouts, loader errors, secrets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from prime_lab.envs import (
    EnvGroup,
    Environment,
    EnvironmentLoadError,
    MissingKeyError,
    MultiTurnEnv,
    Rubric,
    SamplingArgs,
    SingleTurnEnv,
    ThinkParser,
    XMLParser,
    ensure_keys,
    load_env_files,
    load_environment,
    redact,
)
from prime_lab.envs.env_server import EnvironmentDown
from prime_lab.envs.environment import Rollout
from prime_lab.envs.verifiers_adapter import GroupEnvironment
from tests.envs.scripted import scripted_endpoint


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)


def test_rubric_injects_declared_kwargs_sync_and_async_and_survives_errors() -> None:
    seen: dict[str, Any] = {}

    def exact(completion: Any, answer: str) -> float:
        return float(completion[-1]["content"] == answer)

    async def uses_info(info: dict[str, Any], task: str, **kwargs: Any) -> float:
        seen.update(kwargs, info=info, task=task)
        return 0.5

    def broken(answer: str) -> float:
        raise RuntimeError("judge unavailable")

    rubric = Rubric([exact, uses_info, broken], weights=[1.0, 2.0, 1.0])
    score = rubric.score_sync(prompt=[], completion=[{"role": "assistant", "content": "42"}], answer="42",
                              state={}, info={"k": 1}, task="t")
    assert score.reward == pytest.approx(1.0 + 2 * 0.5)
    assert score.metrics == {"exact": 1.0, "uses_info": 0.5, "broken": 0.0}
    assert "broken raised RuntimeError: judge unavailable" in score.errors[0]
    assert seen["info"] == {"k": 1} and "parser" in seen and "answer" in seen


def test_parsers() -> None:
    xml = XMLParser(["think", "answer"])
    assert xml.parse("<think>hm</think>\n<answer> 7 </answer>") == "7"
    assert xml.parse("<answer>1</answer> then <answer>2</answer>") == "2"
    assert xml.parse("<answer>cut off by max_tokens") == "cut off by max_tokens"
    assert xml.parse("no tags") is None
    assert xml.format_reward([{"role": "assistant", "content": "<answer>3</answer>"}]) == 0.5
    think = ThinkParser(XMLParser(["answer"]))
    assert think.parse("<think>maybe <answer>1</answer></think><answer>2</answer>") == "2"


def test_question_rows_get_the_system_prompt_and_splits_are_seeded() -> None:
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    env = SingleTurnEnv(dataset=rows, eval_dataset=rows[:3], system_prompt="Be brief.")
    first = env.get_dataset()[0]
    assert first["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q0"}]
    assert set(first) == {"example_id", "prompt", "answer", "info", "task"}
    assert len(env.get_eval_dataset()) == 3
    assert [r["answer"] for r in env.get_dataset(4, seed=7)] == [r["answer"] for r in env.get_dataset(4, seed=7)]
    assert [r["answer"] for r in env.get_dataset(4, seed=7)] != [r["answer"] for r in env.get_dataset(4)]


def test_prompt_rows_get_the_system_prompt_unless_they_open_with_their_own() -> None:
    user = {"role": "user", "content": "q"}
    rows = [{"prompt": [user], "answer": "a"},
            {"prompt": [{"role": "system", "content": "Mine."}, user], "answer": "b"}]
    env = SingleTurnEnv(dataset=rows, system_prompt="Be brief.",
                        few_shot=[{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}])
    plain, own = env.get_dataset()
    assert plain["prompt"] == [{"role": "system", "content": "Be brief."}, user]  # few-shot: question rows only
    assert own["prompt"] == [{"role": "system", "content": "Mine."}, user]
    assert SingleTurnEnv(dataset=rows).get_dataset()[0]["prompt"] == [user]
    assert rows[0]["prompt"] == [user]  # the caller's rows are not modified
    with scripted_endpoint(["x", "y"]) as ep:
        run(env, ep.base_url, env.get_dataset(), max_concurrent=1)
    assert [r["messages"][0] for r in ep.requests] == [{"role": "system", "content": "Be brief."},
                                                      {"role": "system", "content": "Mine."}]
    assert env.with_system_prompt("Be long.").get_dataset()[0]["prompt"][0]["content"] == "Be long."


class Echo(MultiTurnEnv):
    """Replies 'again' until the model says 'done'; raises when the model says 'boom'."""

    async def is_completed(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> bool:
        return messages[-1]["role"] == "assistant" and messages[-1]["content"] == "done"

    async def env_response(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> Any:
        if messages[-1]["content"] == "boom":
            raise ValueError("env exploded")
        return [{"role": "user", "content": "again"}], state


def run(env: Any, base_url: str, rows: list[dict[str, Any]], **kw: Any) -> Any:
    return asyncio.run(env.run_rollouts(client(base_url), "m", rows, SamplingArgs(max_tokens=8), **kw))


def test_multi_turn_stop_conditions_and_env_response_errors() -> None:
    env = Echo(dataset=[{"question": "start", "answer": ""}], max_turns=3,
               rubric=Rubric([lambda completion: float(len(completion))]))
    rows = env.get_dataset()
    with scripted_endpoint(["a", "done"]) as ep:
        [done] = run(env, ep.base_url, rows)
    assert done.stop_condition == "completed" and [m["content"] for m in done.completion] == ["a", "again", "done"]
    assert ep.requests[1]["messages"][-1] == {"role": "user", "content": "again"}
    with scripted_endpoint(["a", "b", "c", "d"]) as ep:
        [capped] = run(env, ep.base_url, rows)
    assert capped.stop_condition == "max_turns" and len(capped.turns) == 3
    with scripted_endpoint(["boom"]) as ep:
        [broken] = run(env, ep.base_url, rows)
    assert broken.stop_condition == "error" and "ValueError: env exploded" in (broken.error or "")
    assert broken.reward == 1.0  # still scored on what it has


def test_empty_and_malformed_replies_are_recorded_not_fatal() -> None:
    env = SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}],
                        rubric=Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)]))
    rows = env.get_dataset()
    with scripted_endpoint([None, "!malformed"]) as ep:
        empty, malformed = run(env, ep.base_url, rows, rollouts_per_example=2, max_concurrent=1)
    assert empty.error is None and empty.completion == [{"role": "assistant", "content": ""}] and empty.reward == 0
    assert malformed.stop_condition == "error" and "no choices" in (malformed.error or "")


def test_refused_connection_is_an_error_on_each_rollout_quickly() -> None:
    from prime_lab.runs.processes import free_port

    env = SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    rows = env.get_dataset()
    results = run(env, f"http://127.0.0.1:{free_port()}/v1", rows, rollouts_per_example=3)
    assert all(r.stop_condition == "error" and "Connection" in (r.error or "") for r in results)


class Crashing(Environment):
    """A custom environment: its `rollout` raises on a row whose info says "rollout" (EnvironmentDown on "down"),
    its own `score` on "score"; other rows come back with reward 1."""

    async def rollout(self, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs) -> Rollout:
        if row["info"]["fault"] == "down":
            raise EnvironmentDown("environment 'crashing' is down")
        if row["info"]["fault"] == "rollout":
            raise KeyError("board")
        return Rollout(example_id=row["example_id"], task=row["task"], prompt=row["prompt"], info=row["info"],
                       completion=[{"role": "assistant", "content": "hi"}])

    async def score(self, rollout: Rollout) -> None:
        if rollout.info["fault"] == "score":
            raise ZeroDivisionError("no judges")
        rollout.reward = 1.0


class CrashingGroup(GroupEnvironment):
    """A verifiers-style environment (a group at a time) whose `run_group` raises, or is down."""

    def __init__(self, fault: str) -> None:
        self.env_id, self.system_prompt, self.sampling_args, self.fault = "crashing-group", None, {}, fault
        self._reset_rows()

    def _split(self, split: str) -> list[dict[str, Any]] | None:
        return [{"question": "q", "answer": "a"}] if split == "dataset" else None

    async def run_group(self, client: Any, model: str, rows: Sequence[dict[str, Any]],
                        sampling: SamplingArgs) -> list[Rollout]:
        raise EnvironmentDown("down for good") if self.fault == "down" else AttributeError("no 'tools'")


def test_an_exception_a_rollout_or_its_scoring_raises_is_a_failed_rollout_and_environment_down_goes_through() -> None:
    """In run_rollouts (an evaluation, GEPA), through an EnvGroup, and a group environment's own run_rollouts: the
    rollout's exception fails it, blamed on the environment; its scoring's, blamed on the scorer; the others are
    untouched; an environment down for good (EnvironmentDown) still ends the whole."""
    from prime_lab.runs.processes import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    env = Crashing(dataset=[{"question": "q", "info": {"fault": f}} for f in ("rollout", "score", "none")])
    member = Crashing(dataset=[{"question": "q", "info": {"fault": "rollout"}}])
    for crashed, scored, fine in (run(env, url, env.get_dataset()), run(EnvGroup([env]), url, env.get_dataset())):
        assert (crashed.stop_condition, crashed.error_source, crashed.reward) == ("error", "environment", 0.0)
        assert (crashed.error or "").startswith("KeyError: 'board'\n")
        assert (scored.stop_condition, scored.error_source, scored.reward) == ("error", "scorer", 0.0)
        assert (scored.error or "").startswith("ZeroDivisionError: no judges\n") and scored.completion
        assert (fine.error, fine.reward) == (None, 1.0)
    [grouped] = run(EnvGroup([member], names=["m"]), url, EnvGroup([member], names=["m"]).get_dataset())
    assert grouped.error_source == "environment" and grouped.task == "m"
    group = CrashingGroup("raise")
    failed = run(group, url, group.get_dataset(), rollouts_per_example=2)
    assert [(r.stop_condition, r.error_source, (r.error or "").splitlines()[0]) for r in failed] == \
        [("error", "environment", "AttributeError: no 'tools'")] * 2
    down = Crashing(dataset=[{"question": "q", "info": {"fault": "down"}}])
    for whole in (down, EnvGroup([down]), CrashingGroup("down")):
        with pytest.raises(EnvironmentDown):
            run(whole, url, whole.get_dataset())


def test_loader_errors_name_the_id_and_the_valid_args() -> None:
    with pytest.raises(EnvironmentLoadError, match="no environment 'someone/not-here'.*Built-ins: .*reverse-text"):
        load_environment("someone/not-here")
    with pytest.raises(EnvironmentLoadError, match="does not take argument.*colour.*its arguments are: .*max_words"):
        load_environment("primeintellect/reverse-text", colour="red")
    with pytest.raises(EnvironmentLoadError, match=r"load_environment\(difficulty='extreme'\) raised ValueError"):
        load_environment("gsm8k", difficulty="extreme")


def test_a_user_environment_package_installs_with_pip_and_loads_by_id(tmp_path: Path) -> None:
    pkg = tmp_path / "my-echo-env"
    (pkg / "my_echo_env").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "my-echo-env"
        version = "0.0.1"
    """))
    (pkg / "my_echo_env" / "__init__.py").write_text(textwrap.dedent("""
        from prime_lab.envs import Rubric, SingleTurnEnv

        def load_environment(word: str = "hello"):
            return SingleTurnEnv(dataset=[{"question": "say " + word, "answer": word}],
                                 rubric=Rubric([lambda completion, answer: float(answer in completion[-1]["content"])]))
    """))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, str(pkg)], check=True, timeout=300)
    try:
        code = ("from prime_lab.envs import load_environment; "
                "env = load_environment('someone/my-echo-env', word='hi'); "
                "print(env.get_dataset()[0]['answer'], env.env_id)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == ["hi", "someone/my-echo-env"], out.stderr
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "my-echo-env"], timeout=300)


def test_env_files_ensure_keys_and_redaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_API_KEY", raising=False)
    with pytest.raises(MissingKeyError, match="JUDGE_API_KEY"):
        ensure_keys(["JUDGE_API_KEY"])
    (tmp_path / "secrets.env").write_text("# judge\nexport JUDGE_API_KEY='sk-very-secret-123'\n")
    loaded = load_env_files(["secrets.env"], base=tmp_path)
    try:
        assert loaded == {"JUDGE_API_KEY": "sk-very-secret-123"}
        ensure_keys(["JUDGE_API_KEY"])
        assert redact({"log": ["called with sk-very-secret-123"]}) == {"log": ["called with ***"]}
    finally:
        os.environ.pop("JUDGE_API_KEY", None)


def test_the_public_face_is_the_same_api() -> None:
    """`prime_lab.envs`, what users and `prime env init` import, is `prime_lab.envs` object for object."""
    import prime_lab.envs as implementation
    import prime_lab.envs as public

    assert public.__all__ == implementation.__all__
    assert all(getattr(public, name) is getattr(implementation, name) for name in implementation.__all__)
    from prime_lab.envs.scaffold import package_contents

    assert any("from prime_lab.envs import" in text for text in package_contents("my-env", "my_env").values())


def test_sampling_settings_split_into_fields_and_extra_body() -> None:
    """What `-S` or a `[sampling]` table gives: the known fields by name, the rest (min_p, top_k) to the endpoint."""
    args = SamplingArgs.from_settings({"max_tokens": 12, "temperature": 0.5, "stop": ["\n"], "top_k": 20,
                                       "min_p": 0.1})
    assert (args.max_tokens, args.temperature, args.top_p, args.stop) == (12, 0.5, 1.0, ["\n"])
    assert args.extra_body == {"top_k": 20, "min_p": 0.1}
    assert args.request_kwargs()["extra_body"] == {"top_k": 20, "min_p": 0.1}
    assert SamplingArgs.from_settings({}) == SamplingArgs()
