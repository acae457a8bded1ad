"""Start the built-in server as its own process (what the RL launcher, `prime eval` and the tests call).

No torch here: the server process imports it, this one does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prime_lab.inference.builtin.server import BuiltinServerSettings
from prime_lab.inference.control import RuntimeAdapters
from prime_lab.runs.paths import child_python, lab_home
from prime_lab.runs.processes import RunningServer, ServerProcess, free_port

DEFAULT_STARTUP_TIMEOUT_S = 180.0


def builtin_argv(settings: BuiltinServerSettings, port: int, host: str = "127.0.0.1") -> list[str]:
    argv = [
        *child_python(), "-m", "prime_lab.inference.builtin",
        "--model", str(settings.model),
        "--served-model-name", settings.model_name,
        "--host", host,
        "--port", str(port),
        "--dtype", settings.dtype,
        "--max-batch-rows", str(settings.max_batch_rows),
        "--cuda-graphs", settings.cuda_graphs,
    ]  # fmt: skip
    if settings.device:
        argv += ["--device", settings.device]
    if settings.max_model_len:
        argv += ["--max-model-len", str(settings.max_model_len)]
    for name, path in settings.adapters.items():
        argv += ["--adapter", f"{name}={path}"]
    if settings.generation_overrides:
        argv += ["--override-generation-config", json.dumps(settings.generation_overrides)]
    return argv


@dataclass
class BuiltinServer(RunningServer):
    """A running built-in server. `adapters` loads/replaces/unloads LoRA adapters through the HTTP routes."""

    settings: BuiltinServerSettings
    adapters: RuntimeAdapters = field(init=False)

    def __post_init__(self) -> None:
        self.adapters = RuntimeAdapters(self.root_url)

    def stop(self) -> int | None:
        code = self.process.stop(grace=10.0)
        self.adapters.discard_copies()
        return code


def start_builtin_server(
    settings: BuiltinServerSettings,
    *,
    port: int | None = None,
    log_path: Path | None = None,
    timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> BuiltinServer:
    """Start the built-in server for `settings` and wait until `/health` answers (`wait=False`: return at once;
    the caller waits with `server.process.wait_ready`). `env` adds to the server's environment (e.g.
    CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS).

    Raises runs.processes.ServerStartError (with the tail of the server's log) when it exits or is not
    ready within `timeout` seconds.
    """
    model = Path(settings.model)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model} is not a model folder (no config.json); resolve the model first")
    port = port or free_port()
    process = ServerProcess(
        builtin_argv(settings, port),
        port=port,
        log_path=log_path or lab_home() / "logs" / f"builtin-{port}.log",
        env=env,
        name="built-in server",
    )
    process.start()
    if wait:
        try:
            process.wait_ready(timeout=timeout)
        except BaseException:
            process.stop()
            raise
    return BuiltinServer(process=process, model_path=model, model_name=settings.model_name, settings=settings)
