"""Build a built-in server from a model folder (load weights, tokenizer, adapters) and run it with uvicorn."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from prime_lab.inference.builtin.adapters import ModelRegistry, ServedModel
from prime_lab.inference.builtin.completions import CompletionService, SamplingDefaults
from prime_lab.inference.builtin.prompts import PromptCodec

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16", "auto")
CUDA_GRAPHS = ("auto", "on", "off")
DEFAULT_MAX_MODEL_LEN = 32768


@dataclass(frozen=True)
class BuiltinServerSettings:
    model: Path
    served_model_name: str | None = None  # default: the model folder's name
    adapters: dict[str, Path] = field(default_factory=dict)
    dtype: str = "auto"  # auto: bfloat16 on a GPU (as the trainer and vLLM there), float32 on the CPU
    device: str | None = None  # default: cuda when available, else cpu
    max_model_len: int | None = None  # default: the model's max_position_embeddings (capped at 32768)
    max_batch_rows: int = 64
    # The decode step through fixed-shape buffers, replayed as a CUDA graph (graph_decode.py). auto: on a GPU;
    # off: the eager decode (vLLM's --enforce-eager); on: also on the CPU, where nothing is captured (tests).
    cuda_graphs: str = "auto"
    # vLLM's --override-generation-config: temperature, top_p, top_k, max_new_tokens (a request's default max_tokens)
    generation_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name


@dataclass(frozen=True)
class RuntimePlan:
    """Where and how a server runs its model, from its settings and the machine."""

    device: str
    dtype: str  # a torch dtype name
    graph_decode: bool

    def describe(self) -> str:
        if not self.graph_decode:
            decode = "eager decode"
        elif self.device.startswith("cuda"):
            decode = "decode step as CUDA graphs"
        else:
            decode = "fixed-shape decode, uncaptured"
        return f"{self.device}, {self.dtype}, {decode}"


def runtime_plan(settings: BuiltinServerSettings) -> RuntimePlan:
    """The device (cuda when available), the dtype ("auto": bfloat16 on a GPU, float32 on the CPU) and whether the
    decode step is captured ("auto": on a GPU)."""
    import torch

    if settings.dtype not in DTYPES:
        raise ValueError(f"dtype {settings.dtype!r} is not one of {', '.join(DTYPES)}")
    if settings.cuda_graphs not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs {settings.cuda_graphs!r} is not one of {', '.join(CUDA_GRAPHS)}")
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    graph_decode = settings.cuda_graphs == "on" or (settings.cuda_graphs == "auto" and on_gpu)
    return RuntimePlan(device=device, dtype=dtype, graph_decode=graph_decode)


def torch_dtype(name: str, device: str) -> Any:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def sampling_defaults(generation_config: Any, overrides: Mapping[str, Any] | None = None) -> SamplingDefaults:
    """The model's own sampling defaults from generation_config.json with `overrides` over them, as vLLM applies
    them (`--override-generation-config`; its `max_new_tokens` is a request's default `max_tokens`)."""
    found = {k: getattr(generation_config, k, None) for k in ("temperature", "top_p", "top_k")}
    found.update({k: v for k, v in (overrides or {}).items() if k in ("temperature", "top_p", "top_k",
                                                                       "max_new_tokens")})
    temperature, top_p, top_k, most = (found.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens"))
    return SamplingDefaults(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=0 if top_k is None else max(int(top_k), 0),
        max_tokens=None if most is None else max(int(most), 1),
    )


def eos_token_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def load_model(path: Path, dtype: Any) -> Any:
    """The causal LM, with the grouped-query decode attention where the model supports SDPA."""
    from transformers import AutoModelForCausalLM

    from prime_lab.inference.builtin.attention import GROUPED_DECODE_SDPA

    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=GROUPED_DECODE_SDPA)
    except (ValueError, NotImplementedError) as error:  # a model without SDPA support: its default attention
        log.info("grouped decode attention unavailable for %s (%s); using the model's default", path, error)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def build_service(settings: BuiltinServerSettings) -> CompletionService:
    """Load the model and tokenizer, start the engine, load the startup adapters."""
    import torch
    from transformers import AutoTokenizer

    from prime_lab.inference.builtin.cpu_kernels import use_onednn_linears
    from prime_lab.inference.builtin.engine import GenerationEngine

    plan = runtime_plan(settings)
    device = plan.device
    log.info("running %s on %s", settings.model_name, plan.describe())
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    module = use_onednn_linears(load_model(settings.model, torch_dtype(plan.dtype, device)).to(device).eval())
    module.requires_grad_(False)
    max_model_len = settings.max_model_len or min(
        int(getattr(module.config, "max_position_embeddings", DEFAULT_MAX_MODEL_LEN)), DEFAULT_MAX_MODEL_LEN
    )
    codec = PromptCodec(tokenizer)
    registry = ModelRegistry(
        ServedModel(name=settings.model_name, module=module, root=str(settings.model)), prepare=use_onednn_linears
    )
    engine = GenerationEngine(
        codec,
        eos_token_ids(tokenizer, module),
        int(module.config.get_text_config().vocab_size),
        torch.device(device),
        max_batch_rows=settings.max_batch_rows,
        resolve=registry.current,
        graph_decode=plan.graph_decode,
        device_lock=registry.device_lock,  # no graph capture while an adapter merges on the device
    )
    for name, path in settings.adapters.items():
        registry.load_adapter(name, str(path))
    return CompletionService(
        registry=registry,
        engine=engine.start(),
        codec=codec,
        max_model_len=max_model_len,
        defaults=sampling_defaults(getattr(module, "generation_config", None), settings.generation_overrides),
    )


GRACEFUL_SHUTDOWN_S = 2  # what a request still open after the engine stopped gets before uvicorn cancels it


def run_server(
    settings: BuiltinServerSettings,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then return. `on_ready` runs once it serves.

    uvicorn's graceful shutdown waits for every open request to be answered, which would decode each client's
    generation to its end first (minutes of a judge's long answers on a CPU). So shutdown stops the engine first: the
    requests in flight are answered 503 "the server is shutting down" at its next step, and the process exits within
    a second or two. A second SIGINT exits at once."""
    import uvicorn

    from prime_lab.inference.builtin.app import create_app

    service = build_service(settings)
    app = create_app(service, on_startup=on_ready, on_shutdown=service.engine.stop)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # uvicorn's own also re-raises the signal once served (SIGTERM: exit code -15); here run_server returns.
            self.force_exit = self.should_exit and sig == signal.SIGINT
            self.should_exit = True

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            service.engine.stop(timeout=0)  # the requests in flight fail now instead of decoding to their end
            await super().shutdown(sockets)

    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)  # fmt: skip
    log.info("serving %s on http://%s:%d/v1", settings.model_name, host, port)
    Server(config).run()
