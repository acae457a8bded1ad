"""The teacher of a distillation run (`loss = "sft"` or `"opd"` with a `[teacher]`), on the orchestrator's side.

The teacher is an OpenAI-compatible server: a local sampler the launcher starts for `[teacher] model` (built-in or
vLLM, registered as the run's `teacher` process), or the endpoint of `[teacher.client]`.

- `loss = "sft"` (hard distillation): the teacher generates the rollouts, with `[teacher.sampling]` (each unset field
  falls back to `[sampling]`). Its text is tokenized again for the student with the student's chat template
  (trainer/sft_data.py `chat_tokens`), the assistant's tokens trained on: a teacher of another family (another
  tokenizer, an API model) works.
- `loss = "opd"` (on-policy distillation): the student samples as in RL, and the teacher prefill-scores each sample's
  tokens (`inference.scoring.prompt_logprobs`, vLLM's `prompt_logprobs`): the token ids go to the teacher as they
  are, so both must share a tokenizer (compared at validation, or by `prime rl run` once it has built a model that
  was not on this machine), and the student samples at its raw distribution (temperature 1, top_p 1: the teacher's
  prompt logprobs are raw; validation refuses others).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace
from typing import Any

from prime_lab.envs import Rollout, SamplingArgs
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.config import RLConfig

SCORING_CONCURRENCY = 16


@dataclass
class TeacherEndpoint:
    base_url: str
    model: str
    api_key: str = "prime-lab"
    headers: dict[str, str] | None = None


def teacher_sampling(config: RLConfig, student: SamplingArgs) -> SamplingArgs:
    """The teacher's sampling arguments for generating (`loss = "sft"`): `[teacher.sampling]`, else the student's.
    No token ids or logprobs are asked for: the text is tokenized again for the student."""
    assert config.teacher is not None
    t = config.teacher.sampling
    extra = dict(t.extra_body)
    if t.enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": t.enable_thinking}
    if t.reasoning_effort is not None:
        extra["reasoning_effort"] = t.reasoning_effort
    return replace(student, max_tokens=t.max_tokens or student.max_tokens,
                   temperature=student.temperature if t.temperature is None else t.temperature,
                   rl_fields=False, extra_body=extra)


def endpoint_of(config: RLConfig, local_url: str | None, local_model: str | None) -> TeacherEndpoint:
    """Where the teacher answers: the local sampler the launcher started, or `[teacher.client]`."""
    assert config.teacher is not None
    client = config.teacher.client
    if client.base_url is None:
        assert local_url is not None and local_model is not None
        return TeacherEndpoint(local_url, local_model)
    headers = {name: os.environ.get(var, "") for name, var in client.headers_from_env.items()}
    return TeacherEndpoint(client.base_url, config.teacher.model, os.environ.get(client.api_key_var, "prime-lab"),
                           headers or None)


class Teacher:
    def __init__(self, endpoint: TeacherEndpoint, timeout: float = 600.0) -> None:
        from openai import AsyncOpenAI

        self.endpoint = endpoint
        self.model = endpoint.model
        self.client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, timeout=timeout,
                                  default_headers=endpoint.headers, max_retries=2)

    async def score(self, samples: list[Sample]) -> None:
        """Set each sample's `teacher_logprobs`: the teacher's logprob of every token given those before it
        (position 0, which nothing predicts, gets 0)."""
        from prime_lab.inference.scoring import prompt_logprobs

        gate = asyncio.Semaphore(SCORING_CONCURRENCY)

        async def one(sample: Sample) -> None:
            async with gate:
                scored = await prompt_logprobs(self.client, self.model, sample.input_ids)
            sample.teacher_logprobs = [0.0, *scored]

        await asyncio.gather(*(one(s) for s in samples))

    async def close(self) -> None:
        await self.client.close()


def retokenized_samples(rollout: Rollout, tokenizer: Any, *, env: str, policy_version: int = 0) -> list[Sample]:
    """A teacher's rollout as the student's training sample (`loss = "sft"`): the conversation in the student's
    chat template, its assistant tokens trained on (advantage and sampler logprobs 0: cross-entropy needs neither)."""
    from prime_lab.trainer.sft_config import LossMaskConfig
    from prime_lab.trainer.sft_data import SFTDataError, chat_tokens

    messages = [dict(m) for m in [*rollout.prompt, *rollout.completion]]
    try:
        ids, mask = chat_tokens(tokenizer, messages, None, LossMaskConfig())
    except SFTDataError:
        return []
    return [Sample(ids, mask, [0.0] * len(ids), 0.0, env=env, example_id=rollout.example_id, reward=rollout.reward,
                   policy_version=policy_version, is_truncated=rollout.is_truncated, prompt=rollout.prompt,
                   completion=rollout.completion, answer=rollout.answer, metrics=dict(rollout.metrics))]
