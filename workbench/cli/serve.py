"""`prime serve MODEL`: an OpenAI-compatible server in the foreground (the built-in engine, or vLLM)."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import typer

from prime_lab.workbench.cli.common import err, fail

BACKENDS = ("builtin", "vllm")


def parse_adapters(specs: list[str]) -> dict[str, Path]:
    adapters: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            fail(f"--adapter takes NAME=PATH, got {spec!r}")
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            fail(f"--adapter {name}: {folder} is not a LoRA adapter folder (no adapter_config.json)")
        adapters[name] = folder.resolve()
    return adapters


def served_name(spec: str, folder: Path) -> str:
    """The name requests use: the preset or Hugging Face id as typed, or the folder's name for a path."""
    return folder.name if Path(spec).expanduser().exists() else spec


def ensure_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            fail(f"port {port} on {host} is in use; pick another with --port")


def serve(
    model: str = typer.Argument(
        ..., help="A preset (`prime rl models`), a model folder, or a Hugging Face id (downloaded if not on disk)."
    ),
    port: int = typer.Option(8000, "--port", "-p", help="Port on 127.0.0.1."),
    adapter: list[str] = typer.Option([], "--adapter", "-a", help="A LoRA adapter to serve: NAME=PATH (repeatable)."),
    backend: str = typer.Option("builtin", "--backend", "-b", help="builtin (transformers) or vllm."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (float32 on a CPU, bfloat16 on a GPU), float32, "
                              "bfloat16 or float16."),
    max_model_len: int | None = typer.Option(None, "--max-model-len", help="Context length (default: the model's)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
) -> None:
    """Serve MODEL over vLLM's OpenAI-compatible API until Ctrl-C; prints the base URL for `openai` clients."""
    from prime_lab.workbench.cli.models import obtain

    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    adapters = parse_adapters(adapter)
    ensure_port_free(host, port)
    folder = obtain(model)  # a Hugging Face id not on this machine is downloaded first
    name = served_name(model, folder)
    if backend == "vllm":
        _serve_vllm(folder, name, host, port, adapters, dtype, max_model_len)
    else:
        _serve_builtin(folder, name, host, port, adapters, dtype, max_model_len)


def _interrupt_on(*signals: signal.Signals) -> None:
    """Turn these signals into KeyboardInterrupt, so `prime serve` stops its server whether a person presses
    Ctrl-C or a supervisor sends SIGTERM (and even where the shell started it with SIGINT ignored)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in signals:
        signal.signal(sig, interrupt)


def _announce(name: str, backend: str, host: str, port: int, adapters: dict[str, Path]) -> None:
    typer.echo(f"http://{host}:{port}/v1")
    served = ", ".join([name, *adapters])
    err(f"Serving {served} ({backend}) at http://{host}:{port}/v1; Ctrl-C stops it.")


def _serve_builtin(
    folder: Path, name: str, host: str, port: int, adapters: dict[str, Path], dtype: str, max_model_len: int | None
) -> None:
    from prime_lab.inference.builtin.errors import APIError
    from prime_lab.inference.builtin.server import BuiltinServerSettings, run_server

    settings = BuiltinServerSettings(
        model=folder, served_model_name=name, adapters=adapters, dtype=dtype, max_model_len=max_model_len
    )
    err(f"Loading {folder} ...")
    try:
        run_server(settings, host=host, port=port, on_ready=lambda: _announce(name, "builtin", host, port, adapters))
    except APIError as error:  # a startup adapter that does not load
        fail(error.message)
    except (OSError, ValueError) as error:  # a model folder transformers cannot load
        fail(f"could not load {folder}: {error}")


def _serve_vllm(
    folder: Path, name: str, host: str, port: int, adapters: dict[str, Path], dtype: str, max_model_len: int | None
) -> None:
    from prime_lab.evals.policies import lora_rank
    from prime_lab.inference.control import adapter_targets_parameters
    from prime_lab.inference.vllm import VLLMNotInstalledError, VLLMSettings, start_vllm
    from prime_lab.runs.processes import ServerStartError

    extra: tuple[str, ...] = ()
    if adapters:
        extra = ("--lora-modules", *(f"{n}={p}" for n, p in adapters.items()))
    settings = VLLMSettings(
        model=folder,
        served_model_name=name,
        port=port,
        host=host,
        dtype=dtype,
        max_model_len=max_model_len,
        max_lora_rank=max((lora_rank(p) for p in adapters.values()), default=16),
        expert_lora=any(adapter_targets_parameters(p) for p in adapters.values()),
        extra_args=extra,
    )
    err(f"Starting vLLM for {folder} (about a minute on a CPU) ...")
    _interrupt_on(signal.SIGINT, signal.SIGTERM)
    try:
        server = start_vllm(settings)
    except (VLLMNotInstalledError, ServerStartError) as error:
        fail(str(error))
    except KeyboardInterrupt:
        err("Interrupted while vLLM was starting; it has been stopped.")
        raise
    err(f"vLLM log: {server.log_path}")
    _announce(name, "vllm", host, port, adapters)
    try:
        while server.process.poll() is None:
            time.sleep(1.0)
        fail(f"vLLM exited with code {server.process.poll()}; see {server.log_path}")
    except KeyboardInterrupt:
        err("Stopping vLLM ...")
    finally:
        server.stop()
