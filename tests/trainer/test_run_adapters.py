"""An adapter a run writes is a plain PEFT adapter: it loads with peft alone (no prime-lab code) and gives the
trained policy's logprobs. (vLLM's `--lora-modules` serving the same adapter: tests/inference/test_vllm_server.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.servers import TrainedAdapter


def test_a_run_adapter_loads_in_plain_peft_with_the_trainers_logprobs(tiny_model_dir: Path,
                                                                     trained_adapter: TrainedAdapter) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(trained_adapter.path)).eval()
    ids = torch.tensor([trained_adapter.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    got = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1).tolist()
    assert got == pytest.approx(trained_adapter.logprobs, abs=1e-5)
    with torch.no_grad(), model.disable_adapter():
        plain = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    untrained = plain.gather(1, ids[0, 1:, None]).squeeze(1).tolist()
    assert max(abs(a - b) for a, b in zip(got, untrained, strict=True)) > 1e-3, "the step changed nothing"
