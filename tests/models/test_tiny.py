"""Tiny test models: ordinary Hugging Face folders with a working tokenizer and ChatML template."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


def test_tiny_model_loads_with_transformers_and_generates(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen3" and model.config.num_hidden_layers == 2
    assert model.dtype == torch.float32
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5 or tokenizer.eos_token_id in out[0].tolist()


def test_tiny_chat_template_is_chatml_with_enable_thinking(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    no_think = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             enable_thinking=False)
    assert no_think == text + "<think>\n\n</think>\n\n"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text, "the tokenizer must round-trip text"
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>" and tokenizer.eos_token == "<|im_end|>"


def test_same_seed_builds_identical_weights_and_another_seed_does_not(tmp_path: Path) -> None:
    from prime_lab.models import build_tiny_model

    def digest(folder: Path) -> str:
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    first = build_tiny_model(tmp_path / "a", seed=3)
    again = build_tiny_model(tmp_path / "b", seed=3)
    other = build_tiny_model(tmp_path / "c", seed=4)
    assert digest(first) == digest(again) != digest(other)
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"])
def test_tiny_folder_has_the_files_every_loader_expects(tiny_model_dir: Path, name: str) -> None:
    assert (tiny_model_dir / name).is_file()


def test_tiny_moe_models_have_fused_experts_a_router_and_the_same_tokenizer(
    tiny_moe_model_dir: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir)
    config = model.config
    assert config.model_type in {"qwen3_moe", "olmoe", "mixtral"} and config.num_hidden_layers == 2
    assert config.num_experts_per_tok == 2 and config.hidden_size == 64
    layer = model.model.layers[0]
    assert layer.mlp.experts.gate_up_proj.shape == (4, 64, 64) and layer.mlp.experts.down_proj.shape == (4, 64, 32)
    assert layer.mlp.gate.weight.shape == (4, 64)
    assert layer.self_attn.q_proj.out_features // config.num_attention_heads == 32  # head_dim, vLLM's CPU minimum
    assert (tiny_moe_model_dir / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_an_olmoe_shape_whose_head_dim_does_not_follow_from_its_sizes_is_refused(tmp_path: Path) -> None:
    from prime_lab.models import build_tiny_model
    from prime_lab.models.tiny import tiny_moe_shape

    with pytest.raises(ValueError, match="OLMoE's head_dim is hidden_size / num_attention_heads"):
        build_tiny_model(tmp_path / "olmoe", shape=tiny_moe_shape("olmoe", num_attention_heads=4))
