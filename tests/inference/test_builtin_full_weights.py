"""Full fine-tuning's weight path on the built-in server: a trainer's whole-model folder loaded into the running
server in place (`RuntimeWeights`: `/collective_rpc` + `/reset_prefix_cache`), checked against float32 forward
passes of those weights. The server is this module's own: new weights would disturb the session's `builtin_server`.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.control import RuntimeWeights, WeightLoadError
from prime_lab.inference.weights import UPDATE_METHOD
from prime_lab.models.random_lora import build_random_lora_adapter
from tests.inference.full_weights import (
    LOGPROB_TOLERANCE,
    max_logprob_error,
    own_builtin_server,
    sampled,
    weight_versions,
)
from tests.plugins.servers import ReferenceForward

NAME = "tiny-full"
__all__ = ["weight_versions"]  # the module fixture: new weights for the tiny model


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    yield from own_builtin_server(tiny_model_dir, NAME, tmp_path_factory)


@pytest.fixture
def restore_base(server: BuiltinServer, tiny_model_dir: Path) -> Iterator[None]:
    yield
    RuntimeWeights(server.root_url).load(tiny_model_dir)


def test_new_weights_are_served_in_place(
    server: BuiltinServer, weight_versions: list[Path], tiny_model_dir: Path, restore_base: None
) -> None:
    """Each load moves the server to exactly the new weights (tied LM head included), and back."""
    base = ReferenceForward(tiny_model_dir)
    assert max_logprob_error(sampled(server.base_url, NAME), base) < LOGPROB_TOLERANCE
    weights = RuntimeWeights(server.root_url)
    for folder in weight_versions:
        weights.load(folder)
        body = sampled(server.base_url, NAME)
        assert max_logprob_error(body, ReferenceForward(folder)) < LOGPROB_TOLERANCE
        assert max_logprob_error(body, base) > 0.05  # the weights really changed (this test can see a no-op)
    weights.load(tiny_model_dir)
    assert max_logprob_error(sampled(server.base_url, NAME), base) < LOGPROB_TOLERANCE


def test_requests_in_flight_continue_on_the_new_weights(
    server: BuiltinServer, weight_versions: list[Path], restore_base: None
) -> None:
    """The copy happens between two decode steps: a long request keeps decoding (the update does not wait for it),
    and a request sent after the update is served with the new weights."""
    def long_request() -> tuple[dict[str, object], float]:
        body = sampled(server.base_url, NAME, max_tokens=2500)
        return body, time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(long_request)
        time.sleep(1.0)  # decoding
        assert not running.done(), "the long request ended before the update: make it longer"
        RuntimeWeights(server.root_url).load(weight_versions[0])
        loaded_at = time.monotonic()
        after = sampled(server.base_url, NAME)
        body, finished_at = running.result()
    assert loaded_at < finished_at
    choices = body["choices"]
    assert isinstance(choices, list) and all(c["finish_reason"] == "length" for c in choices)
    assert max_logprob_error(after, ReferenceForward(weight_versions[0])) < LOGPROB_TOLERANCE


def test_bad_weights_are_refused_and_the_model_is_unchanged(
    server: BuiltinServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import save_file

    weights = RuntimeWeights(server.root_url)
    with pytest.raises(WeightLoadError, match="HTTP 404"):
        weights.load(tmp_path / "nothing-here")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    save_file({"model.norm.weight": torch.ones(3)}, str(wrong / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="has shape"):
        weights.load(wrong)
    save_file({"model.no_such.weight": torch.ones(3)}, str(wrong / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="not in the served model"):
        weights.load(wrong)
    hidden = json.loads((tiny_model_dir / "config.json").read_text())["hidden_size"]
    save_file({"model.norm.weight": torch.zeros(hidden)}, str(wrong / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="parameters are missing"):
        weights.load(wrong)
    other = httpx.post(server.root_url + "/collective_rpc", json={"method": "sleep", "args": []}, timeout=30)
    assert other.status_code == 400 and UPDATE_METHOD in other.json()["error"]["message"]
    assert max_logprob_error(sampled(server.base_url, NAME), ReferenceForward(tiny_model_dir)) < LOGPROB_TOLERANCE


def test_weights_are_refused_while_adapters_are_loaded(
    server: BuiltinServer, tiny_model_dir: Path, weight_versions: list[Path], tmp_path: Path
) -> None:
    """An adapter is merged into the current weights: replacing them under it would serve neither model."""
    server.adapters.load("merged", build_random_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=1))
    try:
        with pytest.raises(WeightLoadError, match="unload them first"):
            RuntimeWeights(server.root_url).load(weight_versions[0])
    finally:
        server.adapters.unload("merged")
