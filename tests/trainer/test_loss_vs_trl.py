"""Our loss and gradients against TRL's GRPO loss with the same normalisation, on the same model and batch.

TRL's `GRPOTrainer` with `loss_type="dapo"` sums its per-token loss over every completion token of the batch and
divides by their count, as ours does; `beta=0` (no KL term) and on-policy inputs (TRL's old logprobs are its own
detached logprobs, ours are the model's logprobs as the sampler would have returned them) leave every ratio at 1, so
nothing is clipped (TRL) or masked (ours) and both reduce to -sum_it A_i * l_it / N in value and gradient.

Ours goes through the trainer's real path (`Sample`s -> `accumulate_batch_gradients`: micro-batches packed into rows
that hold each group's prompt once, logits / temperature, `policy_loss`); TRL's through `GRPOTrainer.compute_loss`
on an inputs dict shaped like the one its `_generate_and_score_completions` builds (left-padded prompts,
right-padded completions, `num_items_in_batch`, `tool_mask` for tokens the model did not produce), on a deep copy
of the same LoRA model.

trl is a dev dependency (pyproject `dev` extra), so this test runs wherever the test suite does: no import skip.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.loss import group_advantages
from prime_lab.trainer.model import accumulate_batch_gradients, load_policy, token_logprobs

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# groups of GROUP_SIZE rollouts of one prompt, as GRPO samples them (ours packs each group's prompt once)
PROMPTS = ["Reverse this text: hello world", "Reverse this text: hello world", "def add(a, b):", "def add(a, b):"]
COMPLETIONS = ["dlrow olleh", "5", "    return a + b", "Hello there, how are you?"]
REWARDS = [1.0, 0.25, 0.0, 0.5]  # two groups of two -> advantages 0.375, -0.375, -0.25, 0.25
GROUP_SIZE = 2
# Tokens of the last completion that the environment wrote (a multi-turn rollout): loss_mask 0 on ours, tool_mask 0
# on TRL's. Positions within that completion.
ENV_TOKENS = (2, 3)


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Any:
    """The tiny model with a LoRA adapter on every linear, its LoRA weights random (a fresh adapter has B = 0, which
    would leave every A without gradient and hide half the comparison)."""
    model = load_policy(tiny_model_dir, lora_r=4, lora_alpha=8, target_modules=LORA_TARGETS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in _lora_params(model):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def _lora_params(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    assert params and all("lora_" in name for name, _ in params)
    return params


def _token_batch(tokenizer: Any) -> tuple[list[list[int]], list[list[int]], list[float]]:
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]
    completions = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for text in COMPLETIONS]
    assert len({len(p) for p in prompts}) > 1 and len({len(c) for c in completions}) > 1  # padding on both sides
    return prompts, completions, group_advantages(REWARDS, GROUP_SIZE)


def _completion_mask(completion: list[int], index: int, env_tokens: bool) -> list[int]:
    return [0 if env_tokens and index == len(PROMPTS) - 1 and t in ENV_TOKENS else 1 for t in range(len(completion))]


def _our_gradients(model: Any, tokenizer: Any, temperature: float, micro_batch_size: int,
                   env_tokens: bool) -> tuple[float, dict[str, torch.Tensor]]:
    prompts, completions, advantages = _token_batch(tokenizer)
    samples = []
    for i, (prompt, completion, advantage) in enumerate(zip(prompts, completions, advantages, strict=True)):
        ids = prompt + completion
        loss_mask = [0] * len(prompt) + _completion_mask(completion, i, env_tokens)
        with torch.no_grad():  # what the sampler returned: the model's own logprobs, so every ratio is 1
            own, _ = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                                    temperature)
        sampler_logprobs = [lp if m else 0.0 for lp, m in zip(own[0].tolist(), loss_mask, strict=True)]
        samples.append(Sample(input_ids=ids, loss_mask=loss_mask, sampler_logprobs=sampler_logprobs,
                              advantage=advantage))
    model.zero_grad(set_to_none=True)
    result = accumulate_batch_gradients(model, samples, device="cpu",
                                        temperature=temperature, micro_batch_size=micro_batch_size)
    assert result.masked_fraction == 0.0 and result.mismatch_kl == pytest.approx(0.0, abs=1e-6)
    return result.loss, {name: p.grad.clone() for name, p in _lora_params(model) if p.grad is not None}


def _trl_inputs(tokenizer: Any, env_tokens: bool) -> dict[str, torch.Tensor]:
    """The dict GRPOTrainer._generate_and_score_completions hands compute_loss (no vLLM, on-policy, no ref model)."""
    prompts, completions, advantages = _token_batch(tokenizer)
    pad_id = tokenizer.pad_token_id
    prompt_len, completion_len = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = [[pad_id] * (prompt_len - len(p)) + p for p in prompts]  # left-padded, as TRL generates
    prompt_mask = [[0] * (prompt_len - len(p)) + [1] * len(p) for p in prompts]
    completion_ids = [c + [pad_id] * (completion_len - len(c)) for c in completions]
    completion_mask = [[1] * len(c) + [0] * (completion_len - len(c)) for c in completions]
    tool_mask = [_completion_mask(c, i, env_tokens) + [1] * (completion_len - len(c))
                 for i, c in enumerate(completions)]
    loss_mask = torch.tensor(completion_mask) * torch.tensor(tool_mask)
    inputs = {
        "prompt_ids": torch.tensor(prompt_ids),
        "prompt_mask": torch.tensor(prompt_mask),
        "completion_ids": torch.tensor(completion_ids),
        "completion_mask": torch.tensor(completion_mask),
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "num_items_in_batch": loss_mask.sum(),
    }
    if env_tokens:
        inputs["tool_mask"] = torch.tensor(tool_mask)
    return inputs


def _no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)


def _named(name: str) -> Callable[[str], str]:
    """An assert_close message that keeps its own (which element, by how much) and adds the parameter's name."""
    return lambda message: f"{name}: {message}"


def _trl_gradients(model: Any, tokenizer: Any, temperature: float, output_dir: Path,
                   env_tokens: bool) -> tuple[float, dict[str, torch.Tensor]]:
    args = GRPOConfig(
        output_dir=str(output_dir),
        loss_type="dapo",  # token-level: sum over the batch's completion tokens / their count
        scale_rewards="none",
        beta=0.0,
        temperature=temperature,
        per_device_train_batch_size=len(PROMPTS),
        num_generations=GROUP_SIZE,
        bf16=False,  # float32 like our trainer on a CPU
        gradient_checkpointing=False,
        use_cpu=True,
        report_to=[],
    )
    trl_trainer = GRPOTrainer(
        model=model,
        reward_funcs=_no_reward,  # compute_loss takes the advantages from the inputs
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
    )
    trl_trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which we do not run
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trl_trainer.compute_loss(model, _trl_inputs(tokenizer, env_tokens))
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in _lora_params(model) if p.grad is not None}


@pytest.mark.parametrize(("temperature", "micro_batch_size", "env_tokens"), [
    pytest.param(1.0, 4, False, id="t1-one-micro-batch"),
    pytest.param(1.0, 1, False, id="t1-micro-batches-of-1"),
    pytest.param(0.7, 2, False, id="t0.7-micro-batches-of-2"),
    pytest.param(1.0, 2, True, id="t1-environment-tokens-masked"),
])
def test_loss_and_gradients_match_trl_grpo_dapo(policy: Any, tiny_model_dir: Path, tmp_path: Path,
                                                temperature: float, micro_batch_size: int, env_tokens: bool) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trl_model = copy.deepcopy(policy)  # before our backward: same weights, no gradients
    our_loss, our_grads = _our_gradients(policy, tokenizer, temperature, micro_batch_size, env_tokens)
    trl_loss, trl_grads = _trl_gradients(trl_model, tokenizer, temperature, tmp_path / "trl", env_tokens)

    assert our_loss == pytest.approx(trl_loss, rel=1e-5)
    assert our_grads.keys() == trl_grads.keys() == {name for name, _ in _lora_params(policy)}
    for name, grad in our_grads.items():
        assert grad.abs().max() > 0, f"{name} got no gradient: the comparison would be vacuous"
        scale = float(trl_grads[name].abs().max())  # float32 sums in another order: 1e-5 of the largest entry
        torch.testing.assert_close(grad, trl_grads[name], rtol=1e-4, atol=1e-5 * scale, msg=_named(name))


def test_a_different_temperature_gives_different_gradients(policy: Any, tiny_model_dir: Path) -> None:
    """The temperature cases above compare something: at 0.7 the gradients are not those at 1."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    _, at_one = _our_gradients(policy, tokenizer, 1.0, 4, False)
    _, at_point_seven = _our_gradients(policy, tokenizer, 0.7, 4, False)
    assert any(not torch.allclose(at_one[n], at_point_seven[n], rtol=1e-3) for n in at_one)
