"""At step 1, before any update, the trainer and the sampler must give the sampled tokens the same logprobs.

`first_step_mismatch_kl` samples completions from a running server (built-in or vLLM) with the RL fields, turns
them into training samples as the orchestrator does, and runs the trainer's own loss pass on a fresh LoRA policy
(B = 0, so the policy is the base model): the `policy/kl` the trainer would log at step 1. Used by the agreement
tests of both engines, on the real SmolLM2 (a tiny random model's distribution is near uniform at every temperature,
so raw and processed logprobs nearly coincide and a test on it would pass with the bug still there).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import openai

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.model import accumulate_batch_gradients, load_policy

PROMPTS = ["Reverse the text: 'a quiet river at dawn'", "Name three colours and say why you like them.",
           "Write one sentence about the sea."]
SETTINGS = [(0.7, 1.0), (1.0, 1.0), (1.3, 1.0), (0.8, 0.9)]  # (temperature, top_p)


@functools.lru_cache(maxsize=2)
def fresh_policy(model_dir: Path) -> Any:
    return load_policy(model_dir, lora_r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])


def sampled_batch(base_url: str, model: str, *, temperature: float, top_p: float, n: int = 4,
                  max_tokens: int = 24) -> list[Sample]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=300)
    samples: list[Sample] = []
    for prompt in PROMPTS:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], n=n, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, logprobs=True, seed=7, extra_body={"return_token_ids": True})
        body = response.model_dump()
        prompt_ids = body["prompt_token_ids"]
        for choice in body["choices"]:
            ids, logprobs = choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]
            assert ids and len(ids) == len(logprobs)
            samples.append(Sample(input_ids=prompt_ids + ids, loss_mask=[0] * len(prompt_ids) + [1] * len(ids),
                                  sampler_logprobs=[0.0] * len(prompt_ids) + logprobs, advantage=1.0))
    return samples


def first_step_mismatch_kl(base_url: str, model: str, model_dir: Path, *, temperature: float, top_p: float) -> float:
    samples = sampled_batch(base_url, model, temperature=temperature, top_p=top_p)
    policy = fresh_policy(model_dir)
    policy.zero_grad(set_to_none=True)
    result = accumulate_batch_gradients(policy, samples, device="cpu", temperature=temperature, top_p=top_p,
                                        micro_batch_size=4)
    policy.zero_grad(set_to_none=True)
    # the KL leaves out tokens outside the trainer's nucleus: at step 1 (the sampler's own policy) there are none
    assert result.outside_nucleus == 0, f"{result.outside_nucleus:.2%} of sampled tokens outside the nucleus at step 1"
    return result.mismatch_kl


def raw_mismatch_kl(base_url: str, model: str, model_dir: Path, *, temperature: float) -> float:
    """The same figure for a trainer that ignores the temperature: how wrong the objective would be (the check that
    the agreement test can fail on this model)."""
    samples = sampled_batch(base_url, model, temperature=temperature, top_p=1.0)
    policy = fresh_policy(model_dir)
    result = accumulate_batch_gradients(policy, samples, device="cpu", temperature=1.0, micro_batch_size=4)
    policy.zero_grad(set_to_none=True)
    return result.mismatch_kl
