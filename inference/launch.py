"""Start a sampler for a job (evaluation, RL, GEPA): the built-in server or vLLM, each as its own process.

Both engines answer the same protocol and return a `RunningServer` (base URL, served model name, stop()). With
`SamplerOptions.lora` off (full fine-tuning) both take full weights at runtime (`inference.control.RuntimeWeights`):
the built-in server always can; vLLM starts with our worker extension and its developer routes. `env` (e.g.
CUDA_VISIBLE_DEVICES) and `wait=False` let a caller place several servers on their own devices and boot them side
by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prime_lab.runs.processes import RunningServer
from prime_lab.runs.registry import Run

LOCAL_BACKENDS = ("builtin", "vllm")


@dataclass(frozen=True)
class SamplerOptions:
    """The `[inference]` settings both engines understand (None: the engine's default for this device)."""

    port: int | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # vLLM only: engines behind one server
    gpu_memory_utilization: float | None = None
    kv_cache_gb: float = 2.0
    max_lora_rank: int = 16  # the adapters' rank ([lora].r); vLLM rounds it up to a rank it accepts
    lora: bool = True  # False: full fine-tuning, the sampler takes full weights at runtime instead of adapters
    expert_lora: bool = False  # vLLM only: adapters on fused MoE experts (peft target_parameters)
    # Defaults over the model's generation_config (vLLM's --override-generation-config, the built-in server's too):
    # temperature, top_p, top_k, max_new_tokens (a request's max_tokens when it sets none). A judge's.
    generation_config: dict[str, Any] = field(default_factory=dict)


def start_sampler(backend: str, model_path: Path, log_path: Path, *, served_name: str | None = None,
                  timeout: float = 600.0, max_lora_rank: int = 16, options: SamplerOptions | None = None,
                  env: Mapping[str, str] | None = None, wait: bool = True) -> RunningServer:
    """Start `backend` on `model_path` and wait until it is ready (`wait=False`: return once the process runs; wait
    with `server.process.wait_ready`). `env` adds to the server's environment.

    Raises runs.processes.ServerStartError when it does not come up (with the server log's tail) or, before
    starting, when vLLM would refuse the options (its subclass inference.vllm.VLLMSettingsError: a LoRA rank above
    512), and inference.vllm.VLLMNotInstalledError for vLLM where it is not installed.
    """
    opts = options or SamplerOptions(max_lora_rank=max_lora_rank)
    dtype = None if opts.dtype in (None, "auto") else opts.dtype
    if backend == "vllm":
        from prime_lab.inference.vllm import VLLMSettings, start_vllm

        settings = VLLMSettings(model=model_path, served_model_name=served_name, port=opts.port or None,
                                max_lora_rank=opts.max_lora_rank, expert_lora=opts.expert_lora, dtype=dtype,
                                tensor_parallel_size=opts.tensor_parallel_size,
                                data_parallel_size=opts.data_parallel_size,
                                gpu_memory_utilization=opts.gpu_memory_utilization, cpu_kv_cache_gib=opts.kv_cache_gb,
                                max_model_len=opts.max_model_len or None,
                                override_generation_config=dict(opts.generation_config))
        if not opts.lora:
            settings = settings.taking_full_weights()
        return start_vllm(settings, log_path=log_path, timeout=timeout, env=env, wait=wait)
    if backend == "builtin":
        from prime_lab.inference.builtin.launcher import start_builtin_server
        from prime_lab.inference.builtin.server import BuiltinServerSettings

        builtin = BuiltinServerSettings(model=model_path, served_model_name=served_name,
                                        max_model_len=opts.max_model_len,
                                        generation_overrides=dict(opts.generation_config))
        if dtype:
            builtin = replace(builtin, dtype=dtype)
        return start_builtin_server(builtin, port=opts.port or None, log_path=log_path, timeout=timeout, env=env,
                                    wait=wait)
    raise ValueError(f"cannot start backend {backend!r}: use one of {', '.join(LOCAL_BACKENDS)}")


def start_run_sampler(model_name: str, run: Run, backend: str, *, role: str = "inference",
                      announce: Callable[[str], None] = print) -> RunningServer:
    """Resolve `model_name` (a preset, a folder) and start `backend` on it for `run`: its log is
    `logs/<role>.log` and its process is registered under `role`. Raises models.ModelNotFoundError for a model
    that is not on this machine, and what `start_sampler` raises."""
    from prime_lab.models import resolve_model

    path = resolve_model(model_name)
    announce(f"Starting the {backend} sampler on {path} ...")
    sampler = start_sampler(backend, path, run.log_path(role),
                            served_name=None if Path(model_name).exists() else model_name)
    if sampler.process.pid:
        run.register_process(role, sampler.process.pid)
    return sampler
