"""The built-in server on tiny Mixture-of-Experts models (Qwen3-MoE, OLMoE, Mixtral shapes; once per family): a LoRA
adapter on the fused experts (peft `target_parameters`) merged into its own weights, and a full fine-tuning
trainer's weights (saved one tensor per expert, served fused) loaded in place, each checked against float32 forward
passes of the weights it should be serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.control import RuntimeWeights
from prime_lab.models.random_lora import build_random_lora_adapter
from tests.inference.full_weights import (
    LOGPROB_TOLERANCE,
    max_logprob_error,
    own_builtin_server,
    perturbed_model,
    sampled,
)
from tests.plugins.servers import ReferenceForward

NAME = "tiny-moe"


@pytest.fixture(scope="module")
def server(tiny_moe_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    yield from own_builtin_server(tiny_moe_model_dir, NAME, tmp_path_factory)


def test_an_adapter_on_the_experts_is_served_and_the_base_stays_as_it_was(
    server: BuiltinServer, tiny_moe_model_dir: Path, tmp_path: Path
) -> None:
    adapter = build_random_lora_adapter(tiny_moe_model_dir, tmp_path / "adapter", rank=4, b_std=0.05,
                                        target_modules=("q_proj", "v_proj"),
                                        target_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
    reference = ReferenceForward(tiny_moe_model_dir)
    server.adapters.load("experts", adapter)
    try:
        body = sampled(server.base_url, "experts")
        for choice in body["choices"]:
            served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            expected = reference.logprobs(body["prompt_token_ids"], choice["token_ids"], adapter)
            assert served == pytest.approx(expected, abs=LOGPROB_TOLERANCE)
        assert max_logprob_error(body, reference) > 0.05  # the adapter changes the model: the check above can fail
        assert max_logprob_error(sampled(server.base_url, NAME), reference) < LOGPROB_TOLERANCE
    finally:
        server.adapters.unload("experts")


def test_full_weights_saved_one_tensor_per_expert_load_in_place(
    server: BuiltinServer, tiny_moe_model_dir: Path, tmp_path: Path
) -> None:
    from safetensors import safe_open

    folder = perturbed_model(tiny_moe_model_dir, tmp_path / "step_1", seed=1)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        assert "model.layers.0.mlp.experts.gate_up_proj" not in handle.keys()  # noqa: SIM118
    weights = RuntimeWeights(server.root_url)
    try:
        weights.load(folder)
        body = sampled(server.base_url, NAME)
        assert max_logprob_error(body, ReferenceForward(folder)) < LOGPROB_TOLERANCE
        assert max_logprob_error(body, ReferenceForward(tiny_moe_model_dir)) > 0.05
    finally:
        weights.load(tiny_moe_model_dir)
    assert max_logprob_error(sampled(server.base_url, NAME), ReferenceForward(tiny_moe_model_dir)) < LOGPROB_TOLERANCE
