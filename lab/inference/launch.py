"""Start a sampler for a job (evaluation, RL, GEPA): the built-in server or vLLM, each as its own process.

Both engines answer the same protocol and return a `RunningServer` (base URL, served model name, stop()).
"""

from __future__ import annotations

from pathlib import Path

from lab.inference.process import RunningServer

LOCAL_BACKENDS = ("builtin", "vllm")


def start_sampler(backend: str, model_path: Path, log_path: Path, *, served_name: str | None = None,
                  timeout: float = 600.0, max_lora_rank: int = 16) -> RunningServer:
    """Start `backend` on `model_path` and wait until it is ready.

    Raises lab.inference.process.ServerStartError (with the server log's tail) when it does not come up, and
    lab.inference.vllm.VLLMNotInstalledError for vLLM where it is not installed.
    """
    if backend == "vllm":
        from lab.inference.vllm import VLLMSettings, start_vllm

        return start_vllm(VLLMSettings(model=model_path, served_model_name=served_name, max_lora_rank=max_lora_rank),
                          log_path=log_path, timeout=timeout)
    if backend == "builtin":
        from lab.inference.builtin.launcher import start_builtin_server
        from lab.inference.builtin.server import BuiltinServerSettings

        return start_builtin_server(BuiltinServerSettings(model=model_path, served_model_name=served_name),
                                    log_path=log_path, timeout=timeout)
    raise ValueError(f"cannot start backend {backend!r}: use one of {', '.join(LOCAL_BACKENDS)}")
