"""`[trainer] activation_checkpointing`: the same gradients, with each decoder layer run again in the backward pass
(its activations recomputed, not kept)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prime_lab.trainer.model import (
    accumulate_batch_gradients,
    enable_activation_checkpointing,
    load_full_policy,
    load_policy,
)
from tests.support.trainer_runs import (
    STEPS,
    base_batches,
    config_text,
    new_run,
    random_batch,
    train,
    trainer_metrics,
    weights,
)


def gradients_and_layer_calls(model: Any) -> tuple[dict[str, torch.Tensor], int]:
    """The batch's gradients, and how many times decoder layers ran (forward and any recomputation)."""
    calls = 0

    def count(*_: Any) -> None:
        nonlocal calls
        calls += 1

    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    hooks = [layer.register_forward_pre_hook(count) for layer in layers]  # (a recompute may stop before the end)
    model.train()
    model.zero_grad(set_to_none=True)
    accumulate_batch_gradients(model, random_batch(model.config.vocab_size), device="cpu", temperature=0.7,
                               micro_batch_size=2)
    for hook in hooks:
        hook.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, calls


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_same_gradients_with_layers_recomputed(tiny_model_dir: Path, lora: bool) -> None:
    def policy() -> Any:
        if not lora:
            return load_full_policy(tiny_model_dir)
        model = load_policy(tiny_model_dir, lora_r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():  # a non-zero B, so every LoRA matrix gets a gradient
            for param in (p for p in model.parameters() if p.requires_grad):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        return model

    plain, checkpointed = policy(), policy()
    enable_activation_checkpointing(checkpointed)
    expected, plain_calls = gradients_and_layer_calls(plain)
    got, checkpointed_calls = gradients_and_layer_calls(checkpointed)
    assert plain_calls > 0 and checkpointed_calls == 2 * plain_calls  # every layer ran again in the backward
    assert expected.keys() == got.keys() and expected
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_model_without_support_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match=r"\[trainer\].activation_checkpointing"):
        enable_activation_checkpointing(torch.nn.Linear(2, 2))


def test_a_run_with_the_setting_trains_as_one_without_it(tiny_model_dir: Path) -> None:
    """The Trainer takes `[trainer] activation_checkpointing` from the config: the same published weights."""
    batches = base_batches(tiny_model_dir, STEPS)
    published = []
    for on in (False, True):
        text = config_text(tiny_model_dir) + f"activation_checkpointing = {'true' if on else 'false'}\n"
        run = new_run(tiny_model_dir, text, batches)
        trainer = train(run, tiny_model_dir)
        assert trainer.model.is_gradient_checkpointing is on
        assert all(m["perf/peak_memory_gib"] > 0 for m in trainer_metrics(run).values())
        published.append(weights(run.dir / "weights" / f"step_{STEPS}"))
    plain, checkpointed = published
    assert plain.keys() == checkpointed.keys()
    for name, tensor in plain.items():
        torch.testing.assert_close(checkpointed[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
