"""Built-in environments: deterministic data, disjoint splits, and rewards on known answers (perfect = 1).

Multi-turn flows are driven by a scripted endpoint that plays a perfect or a wrong model.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai import AsyncOpenAI

from prime_lab.envs import SamplingArgs, builtin_environments, load_environment
from prime_lab.envs.builtin.wordle import feedback
from tests.envs.scripted import scripted_endpoint

IDS = ["primeintellect/reverse-text", "primeintellect/alphabet-sort", "primeintellect/gsm8k",
       "primeintellect/wordle", "primeintellect/math-python", "primeintellect/code-tests"]


def play(env_id: str, replies: list[str | None], **args: Any) -> Any:
    env = load_environment(env_id, **args)
    row = env.get_eval_dataset(1)[0]
    with scripted_endpoint(replies) as ep:
        client = AsyncOpenAI(base_url=ep.base_url, api_key="x", max_retries=0)
        [rollout] = asyncio.run(env.run_rollouts(client, "m", [row], SamplingArgs(max_tokens=32)))
    return rollout, row, ep


def first_row(env_id: str, **args: Any) -> dict[str, Any]:
    return load_environment(env_id, **args).get_eval_dataset(1)[0]


def test_every_builtin_is_listed_with_its_args() -> None:
    infos = {i.id: i for i in builtin_environments()}
    assert sorted(infos) == sorted(IDS)
    assert {"min_turns", "max_turns"} <= {a.name for a in infos["primeintellect/alphabet-sort"].args}
    assert {"difficulty", "split"} <= {a.name for a in infos["primeintellect/gsm8k"].args}


@pytest.mark.parametrize("env_id", IDS)
def test_data_is_deterministic_with_disjoint_splits(env_id: str) -> None:
    a, b = load_environment(env_id), load_environment(env_id)
    assert a.get_dataset(20) == b.get_dataset(20)
    train = {repr((r["prompt"], r["answer"], r["info"])) for r in a.get_dataset()}
    test = {repr((r["prompt"], r["answer"], r["info"])) for r in a.get_eval_dataset()}
    assert train and test and not train & test
    assert len(load_environment(env_id, max_examples=5).get_dataset()) == 5


def test_reverse_text_rewards() -> None:
    row = first_row("primeintellect/reverse-text")
    perfect, _, _ = play("primeintellect/reverse-text", [f"<reversed_text>{row['answer']}</reversed_text>"])
    wrong, _, _ = play("primeintellect/reverse-text", ["<reversed_text>zzzz</reversed_text>"])
    assert perfect.reward == 1.0 and wrong.reward < 0.5


def test_gsm8k_rewards() -> None:
    row = first_row("primeintellect/gsm8k")
    perfect, _, _ = play("primeintellect/gsm8k", [f"<think>add</think>So <answer>{row['answer']}</answer>"])
    wrong, _, _ = play("primeintellect/gsm8k", [f"<answer>{int(row['answer']) + 1}</answer>"])
    assert perfect.reward == 1.0 and wrong.reward == 0.0


def test_alphabet_sort_over_turns() -> None:
    args = {"min_turns": 3, "max_turns": 3}
    row = first_row("primeintellect/alphabet-sort", **args)
    turns = row["info"]["turns"]
    answers = ["<alphabetical_sorted>\n" + "\n".join(sorted(n for t in turns[: i + 1] for n in t))
               + "\n</alphabetical_sorted>" for i in range(3)]
    perfect, _, ep = play("primeintellect/alphabet-sort", answers, **args)
    assert perfect.reward == 1.0 and perfect.stop_condition == "completed" and len(perfect.turns) == 3
    assert all(n in ep.requests[1]["messages"][-1]["content"] for n in turns[1])  # the env gave the new names
    half, _, _ = play("primeintellect/alphabet-sort", [answers[0], "<alphabetical_sorted>x</alphabetical_sorted>",
                                                       answers[2]], **args)
    assert 0.5 < half.reward < 1.0


def test_wordle_feedback_and_rewards() -> None:
    assert feedback("crane", "crane") == "GGGGG"
    assert feedback("apple", "paper") == "YYGXY"
    assert feedback("lolly", "hello") == "XYGGX"  # the third l has no partner left
    row = first_row("primeintellect/wordle")
    secret = row["answer"]
    wrong_word = "zzzzz"
    solved, _, ep = play("primeintellect/wordle", [f"<guess>{wrong_word}</guess>", f"<guess>{secret}</guess>"])
    assert solved.reward == 1.0 and solved.stop_condition == "solved" and len(solved.turns) == 2
    assert ep.requests[1]["messages"][-1]["content"].startswith("ZZZZZ:")
    lost, _, _ = play("primeintellect/wordle", [f"<guess>{wrong_word}</guess>"] * 6)
    assert lost.reward < 1.0 and lost.stop_condition == "max_turns"
    garbled, _, _ = play("primeintellect/wordle", ["no idea"] * 6)
    assert garbled.reward == 0.0


def test_math_python_calls_the_tool_and_returns_tool_errors() -> None:
    row = first_row("primeintellect/math-python")
    expression = row["prompt"][-1]["content"].removeprefix("What is ").rstrip("?")
    arguments = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    call = f"<tool_call>{arguments}</tool_call>"
    perfect, _, ep = play("primeintellect/math-python", [call, f"<answer>{row['answer']}</answer>"])
    assert perfect.reward == 1.0 and perfect.state["tool_calls"] == 1
    tool_message = ep.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == row["answer"]
    bad = '<tool_call>{"name": "calculate", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>'
    errored, _, ep = play("primeintellect/math-python", [bad, "<answer>0</answer>"])
    assert ep.requests[1]["messages"][-1]["content"].startswith("Error: ValueError")
    assert errored.reward == 0.0 and errored.error is None
