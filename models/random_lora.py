"""LoRA adapters with random non-zero weights, for tests and benchmarks of adapter serving.

A freshly initialised PEFT adapter has `lora_B = 0` and changes nothing; these set both matrices randomly so an
adapter visibly moves the logprobs. Saved in PEFT's format (adapter_config.json + adapter_model.safetensors),
which peft, vLLM and the built-in server load.
"""

from __future__ import annotations

from pathlib import Path

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_random_lora_adapter(
    model_dir: Path,
    dest: Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    seed: int = 0,
    b_std: float = 0.02,
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES,
    target_parameters: tuple[str, ...] = (),
) -> Path:
    """Write a rank-`rank` LoRA adapter for the model in `model_dir` into `dest`, with random A and B: on the
    modules of `target_modules` the model has, and on `target_parameters` (a Mixture-of-Experts model's fused
    experts, e.g. `mlp.experts.down_proj`: one rank-`rank` adapter per expert)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules),
                        target_parameters=list(target_parameters) or None, lora_dropout=0.0)
    generator = torch.Generator().manual_seed(seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * b_std)
            elif "lora_A" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    return dest
