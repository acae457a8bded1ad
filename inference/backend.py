"""Which engine serves a run: `[inference] backend = "auto" | "builtin" | "vllm" | "external"`.

`auto` takes vLLM on a GPU. On a CPU it takes the engine that `bench/sampler.py` measured faster for what an RL
run does (16 concurrent requests through a LoRA adapter), recorded below; the reason string says which and why,
and the run's log prints it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from prime_lab.inference.vllm import VLLMNotInstalledError, vllm_installed
from prime_lab.runs.hardware import cuda_available

Backend = Literal["builtin", "vllm", "external"]
BACKENDS = ("auto", "builtin", "vllm", "external")

# Measured with `.venv/bin/python bench/sampler.py` on a 2-core x86 CPU (AVX-512, no GPU), smollm2-135m, float32,
# chat requests of 64 tokens, aggregate tokens/s (both servers up, engines taking turns batch by batch; the
# machine was shared, 1-min load average 2.1 -> 4.1):
#   engine   model     ready s  1st req s  x1 tok/s  x4 tok/s  x16 tok/s
#   builtin  base          4.8        5.4      13.8      33.7       66.8
#   builtin  adapter       4.8        5.4      14.0      30.6       70.2
#   vllm     base         37.1        0.3      10.8      37.5       89.3
#   vllm     adapter      37.1        0.3       4.0      11.7       43.5
# An RL run samples through its LoRA adapter, so `auto` compares the x16-through-an-adapter column.
CPU_BENCH_COMMAND = ".venv/bin/python bench/sampler.py"
CPU_TOKENS_PER_S_16_VIA_ADAPTER: dict[Backend, float] = {"builtin": 70.2, "vllm": 43.5}
CPU_SECONDS_TO_READY: dict[Backend, float] = {"builtin": 4.8, "vllm": 37.1}


class BackendChoice(NamedTuple):
    backend: Backend
    reason: str


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (the message says what to do instead)."""


def choose_backend(
    requested: str,
    *,
    external_url: str | None = None,
    on_gpu: bool | None = None,
    vllm_available: bool | None = None,
) -> BackendChoice:
    """The engine for `requested` on this machine, and a one-line reason a person can read in the run's log.

    `on_gpu` and `vllm_available` default to what this machine has (torch sees CUDA; vLLM is importable).
    """
    if requested not in BACKENDS:
        raise BackendUnavailableError(f"unknown inference backend {requested!r}: use one of {', '.join(BACKENDS)}")
    if requested == "external":
        if not external_url:
            raise BackendUnavailableError('backend = "external" needs [inference] base_url (an OpenAI-compatible URL)')
        return BackendChoice("external", f"external: the OpenAI-compatible server at {external_url}, as configured")
    has_vllm = vllm_installed() if vllm_available is None else vllm_available
    if requested == "vllm":
        if not has_vllm:
            raise BackendUnavailableError(str(VLLMNotInstalledError()))
        return BackendChoice("vllm", "vllm: as configured")
    if requested == "builtin":
        return BackendChoice("builtin", "builtin: as configured")
    gpu = cuda_available() if on_gpu is None else on_gpu
    if gpu:
        if has_vllm:
            return BackendChoice("vllm", "auto chose vllm: a CUDA GPU is present and vLLM is installed")
        return BackendChoice("builtin", "auto chose builtin: a CUDA GPU is present but vLLM is not installed")
    return _auto_on_cpu(has_vllm)


def _auto_on_cpu(has_vllm: bool) -> BackendChoice:
    builtin, vllm = CPU_TOKENS_PER_S_16_VIA_ADAPTER["builtin"], CPU_TOKENS_PER_S_16_VIA_ADAPTER["vllm"]
    measured = (
        f"{CPU_BENCH_COMMAND} measured {builtin:.0f} tokens/s for builtin vs {vllm:.0f} for vllm at 16 concurrent "
        f"requests through a LoRA adapter, and ready in {CPU_SECONDS_TO_READY['builtin']:.0f} s vs "
        f"{CPU_SECONDS_TO_READY['vllm']:.0f} s"
    )
    if builtin >= vllm or not has_vllm:
        why = measured if has_vllm else "vLLM is not installed"
        return BackendChoice("builtin", f"auto chose builtin on this CPU: {why}")
    return BackendChoice("vllm", f"auto chose vllm on this CPU: {measured}")
