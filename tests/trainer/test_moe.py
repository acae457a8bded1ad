"""Mixture-of-Experts models in the trainer, on tiny Qwen3-MoE, OLMoE and Mixtral shapes (`tiny_moe_model_dir` runs
each test once per family). In transformers 5 a layer's experts are two fused 3-D parameters, which LoRA reaches
through `[lora].target_parameters` (peft's ParamWrapper: one adapter per expert); the router is left alone unless
named. The `Trainer` runs on batches written the way the orchestrator writes them (tests/support/trainer_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.config import validate_rl_config, validate_rl_file
from prime_lab.trainer.runtime import step_dirs
from tests.support.trainer_runs import base_batches, config_text, new_run, train, trainer_metrics, weights

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
STEPS = 2
LORA = f"""
[lora]
r = 4
alpha = 8
target_modules = {json.dumps(ATTENTION)}
target_parameters = {json.dumps(EXPERTS)}
"""


@pytest.fixture(scope="module")
def batches(tiny_moe_model_dir: Path) -> list[list[Sample]]:
    return base_batches(tiny_moe_model_dir, STEPS)


def lora_config(model: Path) -> str:
    text = config_text(model, steps=STEPS)
    return text.replace("\n[lora]\nenabled = false\n", LORA)


def adapted(model: Any) -> set[str]:
    """The names of the modules holding LoRA weights, inside a layer (`self_attn.q_proj`, `mlp.experts`, ...)."""
    return {name.split(".lora_")[0].split("layers.")[-1].split(".", 1)[1].replace(".base_layer", "")
            for name, _ in model.named_parameters() if ".lora_" in name}


def test_lora_on_attention_and_experts_trains_and_loads_in_plain_peft(
    tiny_moe_model_dir: Path, batches: list[list[Sample]]
) -> None:
    """Adapters on the attention and the experts, none on the router; each expert's lora_B moves in the trainer's
    steps (it starts at zero, so only a gradient moves it); the published adapter, loaded by plain peft onto a fresh
    base model, gives exactly the trainer's logprobs."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from prime_lab.trainer.model import token_logprobs

    run = new_run(tiny_moe_model_dir, lora_config(tiny_moe_model_dir), batches)
    trainer = train(run, tiny_moe_model_dir)
    assert adapted(trainer.model) == {f"self_attn.{m}" for m in ATTENTION} | {"mlp.experts"}
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)  # the router and the base experts stay frozen
    assert not [n for n in trainable if ".mlp.gate." in n]
    base = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir)
    assert trainer.model.get_base_model().model.layers[0].mlp.gate.weight.equal(base.model.layers[0].mlp.gate.weight)

    adapter = step_dirs(run.adapters_dir)[STEPS]
    from safetensors.torch import load_file

    saved = load_file(str(adapter / "adapter_model.safetensors"))
    expert_b = {n: t for n, t in saved.items() if ".mlp.experts." in n and "lora_B" in n}
    assert len(expert_b) == 2 * base.config.num_hidden_layers  # gate_up_proj and down_proj in each layer
    assert all(t.abs().max() > 0 for t in expert_b.values()), "an expert's lora_B got no gradient"
    assert trainer_metrics(run)[1]["optim/grad_norm"] > 0

    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir), str(adapter)).eval()
    ids = torch.tensor([batches[0][0].input_ids + batches[1][1].input_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        mine, _ = token_logprobs(trainer.model.eval(), ids, mask)
        theirs, _ = token_logprobs(loaded, ids, mask)
        plain, _ = token_logprobs(base, ids, mask)
    assert torch.allclose(mine, theirs, atol=1e-5), (mine - theirs).abs().max()
    assert (mine - plain).abs().max() > 1e-3  # the adapter changes the policy: the comparison above can fail


def test_full_finetuning_trains_every_weight_experts_and_router_included(
    tiny_moe_model_dir: Path, batches: list[list[Sample]]
) -> None:
    """Published as the checkpoint format (one tensor per expert), loaded back fused: the trainer's own weights."""
    from transformers import AutoModelForCausalLM

    run = new_run(tiny_moe_model_dir, config_text(tiny_moe_model_dir, steps=STEPS), batches)
    trainer = train(run, tiny_moe_model_dir)
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir).named_parameters())
    mine = dict(trainer.model.named_parameters())
    assert {n for n, p in mine.items() if p.requires_grad} == set(base)
    moved = {n for n, p in mine.items() if not p.detach().equal(base[n].detach())}
    assert {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.1.mlp.experts.down_proj"} <= moved
    published = step_dirs(run.dir / "weights")[STEPS]
    assert "model.layers.0.mlp.experts.gate_up_proj" not in weights(published)  # transformers' checkpoint names
    loaded = dict(AutoModelForCausalLM.from_pretrained(published).named_parameters())
    assert all(p.detach().equal(loaded[n].detach()) for n, p in mine.items())


def test_targets_that_match_nothing_are_refused_naming_what_the_model_has(tiny_moe_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    from prime_lab.trainer.model import load_policy

    with pytest.raises(ValueError) as error:
        load_policy(tiny_moe_model_dir, target_modules=["q_proj"], target_parameters=["mlp.experts.gate_proj"])
    message = str(error.value)
    assert message.startswith("[lora].target_parameters: mlp.experts.gate_proj matches no parameter")
    assert all(name in message for name in EXPERTS)
    with pytest.raises(ValueError) as error:  # the experts are parameters, not modules
        load_policy(tiny_moe_model_dir, target_modules=["q_proj", "down_proj"])
    message = str(error.value)
    assert message.startswith("[lora].target_modules: down_proj not found") and "q_proj, v_proj" in message
    assert "name it in target_parameters" in message

    # `prime rl validate` and `prime rl run` say the same, with the line, once the model is on this machine (the
    # editor's validation, on every change, leaves the model alone)
    text = lora_config(tiny_moe_model_dir).replace('"mlp.experts.down_proj"', '"mlp.experts.w2"')
    assert validate_rl_config(text).ok
    config_file = tmp_path / "rl.toml"
    config_file.write_text(text)
    result = validate_rl_file(config_file)
    line = text.splitlines().index(next(t for t in text.splitlines() if t.startswith("target_parameters"))) + 1
    assert [p.format().split(" matches")[0] for p in result.errors] == [
        f"{config_file}:{line}: lora.target_parameters: mlp.experts.w2"]
    assert "mlp.experts.down_proj" in result.errors[0].message
    assert validate_rl_config(lora_config(tiny_moe_model_dir), check_model=True).ok
    dropout = validate_rl_config(lora_config(tiny_moe_model_dir).replace("r = 4", "r = 4\ndropout = 0.1"))
    assert [p.key for p in dropout.errors] == ["lora.dropout"]
