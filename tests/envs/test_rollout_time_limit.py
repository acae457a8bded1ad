"""The per-rollout time limit: a rollout that waits forever (on its own code, on an endpoint that never answers, or
in a reward function that awaits a judge forever) comes back failed as timed out, and the environment's own limit
wins where it is smaller (an EnvGroup's member's too). Real rollouts against the built-in server, a real verifiers
environment in this process, a real socket that never answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openai import AsyncOpenAI

from prime_lab.envs import EnvGroup, MultiTurnEnv, Rubric, SamplingArgs, SingleTurnEnv, load_environment
from prime_lab.envs.environment import (
    DEFAULT_ROLLOUT_TIMEOUT_S,
    TIMED_OUT,
    State,
    rollout_time_limit,
    timed_out,
    timed_rollout,
)
from prime_lab.envs.parsers import Messages
from prime_lab.envs.verifiers_adapter import VerifiersEnvironment, kept_signal_handlers
from prime_lab.trainer.config import EnvConfig
from tests.envs.verifiers_standins import env_folders

SAMPLING = SamplingArgs(max_tokens=2, temperature=1.0, seed=0)


class HangingEnv(MultiTurnEnv):
    """Two model turns; between them, a row with `info.hang` waits forever (a tool that never returns)."""

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        if state["info"].get("hang"):
            await asyncio.sleep(3600)
        return [{"role": "user", "content": "Once more."}], state


def hanging_env() -> HangingEnv:
    rows = [{"question": "Say hi.", "info": {"hang": True}}, {"question": "Say hi.", "info": {"hang": False}}]
    return HangingEnv(max_turns=2, dataset=rows, rubric=Rubric([lambda completion: 1.0]))


def run(coro: Any, bound: float = 30.0) -> Any:
    """`coro`'s result; a test that would hang fails after `bound` seconds instead (TimeoutError)."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, bound)

    return asyncio.run(bounded())


async def judge(completion: Messages, info: dict[str, Any]) -> float:
    """A reward that awaits an LLM judge; for a row with `info.hang`, one that never answers."""
    if info.get("hang"):
        await asyncio.Event().wait()
    return 1.0


def judged_env(**kwargs: Any) -> SingleTurnEnv:
    rows = [{"question": "Say hi.", "info": {"hang": True}}, {"question": "Say hi.", "info": {"hang": False}}]
    return SingleTurnEnv(dataset=rows, rubric=Rubric([judge]), **kwargs)


async def rollouts_of(env: Any, base_url: str, model: str, rows: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    try:
        return await env.run_rollouts(client, model, rows, SAMPLING, **kwargs)
    finally:
        await client.close()


def test_a_rollout_that_sleeps_forever_times_out_and_counts_as_errored(builtin_server: Any) -> None:
    env = hanging_env()
    started = time.perf_counter()
    hung, fine = run(rollouts_of(env, builtin_server.base_url, builtin_server.model_name, env.get_dataset(),
                                 timeout=2.0))
    elapsed = time.perf_counter() - started
    assert timed_out(hung) and hung.error is not None and hung.error.startswith(f"{TIMED_OUT} 2 s")
    assert hung.stop_condition == "error" and hung.reward == 0.0  # errored: a run drops its group
    assert hung.prompt == env.get_dataset()[0]["prompt"] and hung.timing["total_ms"] >= 2000
    assert fine.error is None and not timed_out(fine) and len(fine.turns) == 2 and fine.reward == 1.0
    assert elapsed < 5.0

    # with no limit it would wait forever: the helper alone, cut from outside after a while
    async def unlimited() -> None:
        client = AsyncOpenAI(base_url=builtin_server.base_url, api_key="EMPTY", max_retries=0)
        try:
            await asyncio.wait_for(timed_rollout(env, client, builtin_server.model_name, env.get_dataset()[0],
                                                 SAMPLING, None), 1.0)
        finally:
            await client.close()

    with pytest.raises(TimeoutError):
        run(unlimited())


def test_a_scorer_that_awaits_forever_times_out_within_the_limit(builtin_server: Any) -> None:
    """The limit covers the rollout and its scoring: a reward that never returns fails its rollout, timed out, with
    what the model said kept; the other rollout is scored."""
    env = judged_env()
    started = time.perf_counter()
    hung, fine = run(rollouts_of(env, builtin_server.base_url, builtin_server.model_name, env.get_dataset(),
                                 timeout=1.0), bound=10.0)
    elapsed = time.perf_counter() - started
    assert timed_out(hung) and hung.error is not None
    assert hung.error.startswith(f"{TIMED_OUT} 1 s while its reward functions ran")
    assert hung.reward == 0.0 and hung.metrics == {} and hung.stop_condition == "error"
    assert hung.completion and hung.completion[0]["role"] == "assistant" and hung.timing["total_ms"] >= 1000
    assert fine.error is None and fine.reward == 1.0
    assert elapsed < 3.0  # the limit, and a loaded machine's slack


def test_an_env_group_holds_each_members_own_limit_over_scoring(builtin_server: Any) -> None:
    """An EnvGroup's rollout has its member's limit (the member's own where smaller), its scoring included."""
    group = EnvGroup([judged_env(env_id="judged"), hanging_env()], names=["judged", "hanging"])
    group.envs["judged"].timeout_seconds = 1.0
    rows = group.get_dataset()
    assert [group.time_limit(r, 300.0) for r in rows] == [1.0, 1.0, 300.0, 300.0]
    started = time.perf_counter()
    done = run(rollouts_of(group, builtin_server.base_url, builtin_server.model_name, [rows[0], rows[1], rows[3]],
                           timeout=300.0), bound=10.0)
    assert [timed_out(r) for r in done] == [True, False, False]
    assert done[0].error is not None and done[0].error.startswith(f"{TIMED_OUT} 1 s while its reward")
    assert done[1].reward == 1.0 and done[2].reward == 1.0 and time.perf_counter() - started < 3.0


def test_the_smaller_of_the_configured_and_the_environments_own_limit_wins(builtin_server: Any) -> None:
    env = hanging_env()
    assert rollout_time_limit(env) == DEFAULT_ROLLOUT_TIMEOUT_S == EnvConfig(id="x").timeout
    assert rollout_time_limit(env, None) is None and rollout_time_limit(env, 2.5) == 2.5
    env.timeout_seconds = 0.3  # the environment's own, as verifiers' MultiTurnEnv(timeout_seconds=...) sets it
    assert rollout_time_limit(env, 300.0) == 0.3 and rollout_time_limit(env, None) == 0.3
    assert rollout_time_limit(env, 0.1) == 0.1
    env.timeout_seconds = 0  # not a limit
    assert rollout_time_limit(env, 300.0) == 300.0

    env.timeout_seconds = 0.3
    started = time.perf_counter()
    [hung] = run(rollouts_of(env, builtin_server.base_url, builtin_server.model_name, env.get_dataset()[:1],
                             timeout=300.0))
    assert timed_out(hung) and hung.error is not None and hung.error.startswith(f"{TIMED_OUT} 0.3 s")
    assert time.perf_counter() - started < 5.0


@asynccontextmanager
async def silent_endpoint() -> AsyncIterator[str]:
    """An OpenAI base URL whose server takes each request and never answers (a wedged endpoint or proxy)."""
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # until the client gives up and closes
        finally:
            writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


def verifiers_env(**args: Any) -> VerifiersEnvironment:
    with kept_signal_handlers():  # verifiers would replace pytest's handlers
        env = load_environment("vf-reverse-text", **args)
    assert isinstance(env, VerifiersEnvironment)
    return env


def test_a_verifiers_group_waiting_on_an_endpoint_that_never_answers_times_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in env_folders():
        monkeypatch.syspath_prepend(str(folder))
    env = verifiers_env(timeout_seconds=2.0)  # verifiers' MultiTurnEnv keeps its own limit: it is ours too
    assert env.env.timeout_seconds == 2.0 and rollout_time_limit(env, 300.0) == 2.0
    assert rollout_time_limit(env, 0.4) == 0.4
    rows = env.get_eval_dataset(2)

    async def go() -> tuple[list[Any], float]:
        async with silent_endpoint() as base_url:
            started = time.perf_counter()
            done = await rollouts_of(env, base_url, "stand-in", rows, rollouts_per_example=2, timeout=0.4)
            return done, time.perf_counter() - started

    done, elapsed = run(go())
    assert len(done) == 4 and all(timed_out(r) for r in done)  # each group's rollouts, in order
    assert [r.example_id for r in done] == [rows[0]["example_id"]] * 2 + [rows[1]["example_id"]] * 2
    assert all(r.error is not None and r.error.startswith(f"{TIMED_OUT} 0.4 s") for r in done)
    assert elapsed < 2.0  # ours, not verifiers' own 2 s
