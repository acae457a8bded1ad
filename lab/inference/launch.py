"""Start a sampler for a job (evaluation, RL, GEPA): the built-in server or vLLM, as its own process.

Both engines answer the same protocol; `SamplerHandle` carries what a client needs (base URL, the served model
name) and stops the process. The served name is read back from `/v1/models`, so callers never guess it.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lab.inference.process import ServerProcess, free_port


class _Stoppable(Protocol):
    def stop(self) -> Any: ...


@dataclass
class SamplerHandle:
    backend: str
    base_url: str
    model_name: str
    process: _Stoppable
    pid: int | None = None

    def stop(self) -> None:
        self.process.stop()


def served_models(base_url: str, timeout: float = 10.0) -> list[str]:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout) as response:
        data = json.loads(response.read())
    return [m["id"] for m in data.get("data", [])]


def builtin_argv(model_path: Path, port: int, dtype: str = "float32", extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "lab.inference.builtin", "--model", str(model_path), "--port", str(port),
            "--dtype", dtype, *(extra or [])]


def start_sampler(backend: str, model_path: Path, log_path: Path, *, timeout: float = 600.0,
                  dtype: str = "float32", max_lora_rank: int = 16) -> SamplerHandle:
    """Start `backend` ("builtin" or "vllm") on `model_path`, wait until ready, return its handle.

    Raises lab.inference.process.ServerStartError (with the log tail) when it does not come up.
    """
    if backend == "vllm":
        from lab.inference.vllm import VLLMSettings, start_vllm

        server = start_vllm(VLLMSettings(model=model_path, max_lora_rank=max_lora_rank), log_path=log_path,
                            timeout=timeout)
        return SamplerHandle("vllm", server.base_url, served_models(server.base_url)[0], server,
                             server.process.pid)
    if backend != "builtin":
        raise ValueError(f"cannot start backend {backend!r} (use builtin or vllm)")
    port = free_port()
    process = ServerProcess(builtin_argv(model_path, port, dtype), port=port, log_path=log_path,
                            name="built-in server")
    process.start()
    try:
        process.wait_ready(timeout=timeout)
    except BaseException:
        process.stop()
        raise
    return SamplerHandle("builtin", process.base_url, served_models(process.base_url)[0], process, process.pid)
