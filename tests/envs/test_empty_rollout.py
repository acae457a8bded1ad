"""`empty(rollout)`: a rollout that came back without error and without a word or a tool call from the model."""

from __future__ import annotations

from prime_lab.envs.environment import Rollout, empty


def rollout(completion: list[dict], error: str | None = None) -> Rollout:
    return Rollout(example_id=0, task="t", prompt=[{"role": "user", "content": "hi"}], completion=completion,
                   error=error)


def test_no_text_and_no_tool_call_is_empty() -> None:
    assert empty(rollout([]))
    assert empty(rollout([{"role": "assistant", "content": "  \n"}]))
    assert empty(rollout([{"role": "assistant", "content": None}, {"role": "tool", "content": "42"}]))


def test_a_word_or_a_tool_call_is_not_empty_and_an_error_is_errored_not_empty() -> None:
    assert not empty(rollout([{"role": "assistant", "content": "A"}]))
    assert not empty(rollout([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]))
    assert not empty(rollout([{"role": "assistant", "content": ""}], error="the tool crashed"))
