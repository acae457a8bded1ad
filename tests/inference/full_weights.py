"""What the full-weight tests of both engines share: new weights for the tiny model, a server's logprobs for a
prompt checked against a float32 forward pass of the weights it should be serving, and a module's own built-in server.

`perturbed_model` writes what a full fine-tuning trainer publishes (`save_pretrained` of the whole model, every
parameter moved, the tied embedding / LM head included, where vLLM's CPU build keeps a prepacked copy), beside
the tokenizer so `ReferenceForward` can load the folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server
from prime_lab.inference.builtin.server import BuiltinServerSettings
from tests.plugins.servers import ReferenceForward

# Longer than a vLLM KV-cache block (16 tokens): a repeated request hits the prefix cache, so a server that kept
# state computed with the old weights would show.
LONG_PROMPT = [{"role": "user", "content": "Reverse the text: hello world, the quick brown fox " * 8}]
LOGPROB_TOLERANCE = 1e-4


def own_builtin_server(model_dir: Path, name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    """A built-in server of a test module's own (new weights would disturb the session's `builtin_server`), for a
    module fixture to yield from: started, then stopped."""
    settings = BuiltinServerSettings(model=model_dir, served_model_name=name, max_model_len=4096)
    started = start_builtin_server(settings, log_path=tmp_path_factory.mktemp("builtin") / "server.log", timeout=120)
    yield started
    started.stop()


def perturbed_model(model_dir: Path, dest: Path, *, seed: int, std: float = 0.05) -> Path:
    """A copy of the model folder with every parameter moved by Gaussian noise (relative to its own scale)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(model_dir, dest)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            scale = float(parameter.abs().mean()) or 1.0
            parameter.add_(torch.randn(parameter.shape, generator=generator) * std * scale * 10)
    model.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def weight_versions(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two versions of new weights for the tiny model, as a trainer publishes them (`step_1`, `step_2`)."""
    root = tmp_path_factory.mktemp("weights")
    return [perturbed_model(tiny_model_dir, root / f"step_{k}", seed=k) for k in (1, 2)]


def sampled(
    base_url: str, model: str, *, max_tokens: int = 12, seed: int = 5, salt: str | None = None
) -> dict[str, Any]:
    """Two seeded choices for `LONG_PROMPT` with the RL fields (and a `cache_salt`, as an RL run's requests have)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    extra: dict[str, Any] = {"return_token_ids": True, "ignore_eos": True}
    if salt is not None:
        extra["cache_salt"] = salt
    return client.chat.completions.create(
        model=model, messages=LONG_PROMPT, max_tokens=max_tokens, temperature=1.0, seed=seed, n=2,  # type: ignore[arg-type]
        logprobs=True, extra_body=extra,
    ).model_dump()


def max_logprob_error(body: dict[str, Any], reference: ReferenceForward) -> float:
    """The largest |server - reference| logprob over the sampled tokens of every choice."""
    worst = 0.0
    for choice in body["choices"]:
        served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        expected = reference.logprobs(body["prompt_token_ids"], choice["token_ids"])
        worst = max(worst, *(abs(a - b) for a, b in zip(served, expected, strict=True)))
    return worst
