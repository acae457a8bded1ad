"""`[trainer] compile`: each decoder layer compiled by torch.compile (inductor, on the CPU too) gives the gradients
of the eager model, and a model without decoder layers to compile is refused with the setting to change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prime_lab.trainer.model import accumulate_batch_gradients, compile_layers, decoder_layers, load_policy
from tests.support.trainer_runs import random_batch


@pytest.mark.slow
def test_compiled_layers_give_the_eager_gradients(tiny_model_dir: Path) -> None:
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = load_policy(tiny_model_dir, lora_r=4, lora_alpha=8)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.05, generator=torch.Generator().manual_seed(1))
        if compiled:
            compile_layers(model)
            assert all(layer._compiled_call_impl is not None for layer in decoder_layers(model))
        model.train()
        result = accumulate_batch_gradients(model, random_batch(model.config.vocab_size), device="cpu", temperature=0.7,
                                            micro_batch_size=2, ratio_low=1e-9, ratio_high=1e9)
        assert result.loss != 0.0
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, want in grads[0].items():
        torch.testing.assert_close(grads[1][name], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()), msg=name)


def test_a_model_without_decoder_layers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[trainer\].compile: .*set it to false"):
        compile_layers(torch.nn.Linear(2, 2))
