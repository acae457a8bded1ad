"""`ToolEnv` offers its tools natively (`tools=[...]`), reads native `tool_calls` and `<tool_call>` text alike, and
steps down to what a server takes: the scripted endpoint records the requests; the built-in server and vLLM answer
as they really do."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from prime_lab.envs import Rubric, SamplingArgs, ToolEnv
from tests.envs.scripted import scripted_endpoint


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def adder_env(**kwargs: Any) -> ToolEnv:
    return ToolEnv(tools=[add], dataset=[{"question": "What is 2 + 3?", "answer": "5"}],
                   rubric=Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)]), **kwargs)


def rollouts(env: ToolEnv, base_url: str, model: str, n: int = 1, max_tokens: int = 16) -> list[Any]:
    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    return asyncio.run(env.run_rollouts(client, model, env.get_dataset(),
                                        SamplingArgs(max_tokens=max_tokens, temperature=0.0),
                                        rollouts_per_example=n, max_concurrent=n))


def native_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": arguments}}]}


def test_tools_go_out_with_each_request_and_native_calls_come_back_as_tool_messages() -> None:
    env = adder_env()
    with scripted_endpoint([native_call("call_7", "add", '{"a": 2, "b": 3}'), "5"]) as ep:
        [rollout] = rollouts(env, ep.base_url, "m")
    assert rollout.error is None, rollout.error
    first, second = ep.requests
    assert first["tools"] == second["tools"] == env.tool_schemas
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tools"][0]["function"]["parameters"]["properties"] == {"a": {"type": "integer"},
                                                                        "b": {"type": "integer"}}
    assert "tool_choice" not in first  # the server's default (auto)
    assistant, result = second["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_7"
    assert result == {"role": "tool", "tool_call_id": "call_7", "content": "5"}
    assert rollout.state["tool_protocol"] == "native" and rollout.state["tool_calls"] == 1
    assert rollout.stop_condition == "completed" and rollout.reward == 1.0


def test_a_model_that_answers_in_text_is_still_read() -> None:
    env = adder_env()
    text_call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    with scripted_endpoint([text_call, native_call("c1", "add", '{"a": "x"'), "5"]) as ep:
        [rollout] = rollouts(env, ep.base_url, "m")
    assert [m["role"] for m in rollout.completion] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert rollout.completion[1] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    assert rollout.completion[3]["tool_call_id"] == "c1"
    assert rollout.completion[3]["content"].startswith("Error: arguments are not valid JSON")
    assert all(r["tools"] == env.tool_schemas for r in ep.requests)
    assert "<tool_call>" in env.get_dataset()[0]["prompt"][0]["content"]  # the text protocol is described too
    assert rollout.reward == 1.0


def test_against_the_builtin_server_tool_rollouts_run_with_what_it_takes(builtin_server: Any) -> None:
    """The built-in server answers 400 to `tools` it cannot honour; rollouts must not fail for it."""
    probe = httpx.post(builtin_server.base_url + "/chat/completions", timeout=60, json={
        "model": builtin_server.model_name, "max_tokens": 2, "tools": adder_env().tool_schemas,
        "messages": [{"role": "user", "content": "hi"}]})
    expected = "text" if probe.status_code == 400 else "native"
    if probe.status_code == 400:
        assert "tools" in probe.text  # what makes the environment step down
    env = adder_env(max_turns=2)
    done = rollouts(env, builtin_server.base_url, builtin_server.model_name, n=3, max_tokens=8)
    assert [r.error for r in done] == [None] * 3
    assert [r.state["tool_protocol"] for r in done] == [expected] * 3
    assert all(r.turns and r.token_usage["completion_tokens"] > 0 for r in done)


@pytest.mark.slow
def test_against_vllm_without_auto_tool_choice_the_template_still_shows_the_tools(vllm_server: Any) -> None:
    """vLLM started without --enable-auto-tool-choice refuses tool_choice "auto" and takes "none"."""
    request = {"model": vllm_server.model_name, "max_tokens": 2, "tools": adder_env().tool_schemas,
               "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(vllm_server.base_url + "/chat/completions", json=request, timeout=120)
    assert refused.status_code == 400 and "tool choice" in refused.text
    taken = httpx.post(vllm_server.base_url + "/chat/completions", json={**request, "tool_choice": "none"},
                       timeout=120)
    assert taken.status_code == 200, taken.text
    done = rollouts(adder_env(max_turns=2), vllm_server.base_url, vllm_server.model_name, n=2, max_tokens=8)
    assert [r.error for r in done] == [None, None]
    assert [r.state["tool_protocol"] for r in done] == ["template", "template"]

