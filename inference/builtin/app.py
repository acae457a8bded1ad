"""The HTTP routes (FastAPI): vLLM's OpenAI-compatible surface and its token-in, token-out
`/inference/v1/generate` (route "generate" in the metrics), with OpenAI-style JSON errors, the two developer
routes a trainer's full weights go through (`/collective_rpc` for `weights.UPDATE_METHOD`, `/reset_prefix_cache`),
and `/metrics` in Prometheus' text format, as vLLM serves its own (ours are named `prime_lab_*`, after vLLM's names
where it has one): requests answered, cancelled (by route and model name) and failed (answered 4xx/5xx, by route and
status), prompt and generated tokens by model name, the answered requests' latency as a histogram (vLLM's
`e2e_request_latency_seconds`), and policy loads (LoRA adapters by name, full weights), so a caller that spreads
requests over several servers can see each one's share, and a run can tell how its judge keeps up
(`inference.judge_metrics`).

A completion request whose client disconnects before its answer (a client-side timeout, a cancelled rollout) is
cancelled, as vLLM's `with_cancellation` does: Starlette runs a handler to its end whether or not anyone is left to
read its answer, so the handler races a listener for the connection's `http.disconnect` (`until_disconnected`). The
request leaves the engine at its next step and is counted as cancelled, not answered (vLLM counts it in
`vllm:request_success_total{finished_reason="abort"}`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prime_lab.inference.builtin.completions import CompletionService, model_card
from prime_lab.inference.builtin.errors import APIError, EngineStoppedError, error_body
from prime_lab.inference.builtin.schemas import (
    ChatCompletionRequest,
    CollectiveRpcRequest,
    CompletionRequest,
    GenerateRequest,
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
)
from prime_lab.inference.builtin.streaming import chat_chunks, completion_chunks, event_stream
from prime_lab.inference.weights import UPDATE_METHOD

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)
Result = TypeVar("Result")
Chunker = Callable[[dict[str, Any]], Iterable[dict[str, Any]]]  # a whole answer -> its stream's chunks

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away before the answer
COMPLETION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
                     "/inference/v1/generate": "generate"}  # fmt: skip
# vLLM's request latency buckets (vllm/v1/metrics/buckets.py REQUEST_LATENCY_BUCKETS), with finer ones below 0.3 s
# for the short answers of a small model (a judge's verdict).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


@dataclass
class Histogram:
    """A Prometheus histogram: observations counted per bucket upper bound (cumulated when written), their sum."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)  # the last: +Inf
        self.counts[next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))] += 1
        self.total += value

    def lines(self, metric: str, labels: str) -> list[str]:
        out, seen = [], 0
        for bound, n in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            seen += n
            out.append(f'{metric}_bucket{{{labels},le="{bound}"}} {seen}')
        return [*out, f"{metric}_sum{{{labels}}} {self.total}", f"{metric}_count{{{labels}}} {seen}"]


@dataclass
class ServerMetrics:
    """What `/metrics` reports, counted as requests are answered (the engine counts generated tokens itself)."""

    answered: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, model) -> requests answered
    cancelled: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, model) -> client went away first
    failed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, status) -> answered with an error
    prompt_tokens: Counter[tuple[str]] = field(default_factory=Counter)  # (model,) -> answered requests' prompts
    latency: dict[tuple[str], Histogram] = field(default_factory=dict)  # (model,) -> answered requests' seconds
    loads: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, name) -> policies loaded

    def answer(self, route: str, response: Mapping[str, Any], seconds: float) -> None:
        model = response["model"]
        self.answered[route, model] += 1
        self.prompt_tokens[model,] += int(response.get("usage", {}).get("prompt_tokens", 0))
        self.latency.setdefault((model,), Histogram()).observe(seconds)

    def fail(self, request: Request, status: int) -> None:
        route = COMPLETION_ROUTES.get(request.url.path)
        if route is not None:
            self.failed[route, str(status)] += 1


async def parse_body(request: Request, schema: type[Body]) -> Body:
    """The JSON body validated against `schema`; a 400 APIError for malformed JSON or invalid fields."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(f"the request body is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise APIError(validation_message(error), param=first_error_field(error)) from error


def validation_message(error: ValidationError) -> str:
    parts = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


def first_error_field(error: ValidationError) -> str | None:
    problems = error.errors(include_url=False)
    return ".".join(str(part) for part in problems[0]["loc"]) if problems and problems[0]["loc"] else None


def create_app(
    service: CompletionService,
    on_startup: Callable[[], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        yield
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="prime-lab built-in server", lifespan=lifespan, docs_url=None, redoc_url=None)
    registry = service.registry
    counts = ServerMetrics()

    def failure(request: Request, body: dict[str, Any], status: int) -> JSONResponse:
        counts.fail(request, status)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return failure(request, error.body(), error.status)

    @app.exception_handler(EngineStoppedError)
    async def stopping(request: Request, error: EngineStoppedError) -> JSONResponse:
        status = HTTPStatus.SERVICE_UNAVAILABLE
        return failure(request, error_body(str(error), status), status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return failure(request, error_body(str(error), HTTPStatus.BAD_REQUEST), HTTPStatus.BAD_REQUEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return failure(request, error_body(str(error.detail), error.status_code), error.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("request failed")
        status = HTTPStatus.INTERNAL_SERVER_ERROR
        return failure(request, error_body(f"{type(error).__name__}: {error}", status), status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(m, service.max_model_len) for m in registry.served()]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        tokens = {(name,): n for name, n in dict(service.engine.generation_tokens).items()}
        return PlainTextResponse(prometheus_text(counts, tokens), media_type="text/plain; version=0.0.4")

    async def answer(request: Request, route: str, model: str | None, work: Awaitable[dict[str, Any]],
                     chunks: Chunker | None = None) -> Response:
        """The answer of `work` as JSON, or (`chunks`: the request asked for `stream=true`) as an event stream."""
        start = time.monotonic()
        response = await until_disconnected(request, work)
        if response is None:
            counts.cancelled[route, model or registry.base.name] += 1
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: for the access log
        counts.answer(route, response, time.monotonic() - start)
        if chunks is not None:
            return Response(event_stream(chunks(response)), media_type="text/event-stream")
        return JSONResponse(response)

    def streamed(body: ChatCompletionRequest | CompletionRequest,
                 chunks: Callable[[dict[str, Any], bool], Iterable[dict[str, Any]]]) -> Chunker | None:
        return (lambda response: chunks(response, body.include_usage())) if body.stream else None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        return await answer(request, "chat", body.model, service.chat(body), streamed(body, chat_chunks))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        return await answer(request, "completion", body.model, service.complete(body),
                            streamed(body, completion_chunks))

    @app.post("/inference/v1/generate")
    async def generate(request: Request) -> Response:
        """vLLM's token-in, token-out route (what verifiers v1's renderer client calls): `/v1/completions`'s
        generation from token ids, in vLLM's `GenerateTokensResponse` shape."""
        body = await parse_body(request, GenerateRequest)
        return await answer(request, "generate", body.model, service.generate(body))

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await parse_body(request, LoadLoraAdapterRequest)
        message = await asyncio.to_thread(registry.load_adapter, body.lora_name, body.lora_path, body.load_inplace)
        counts.loads["adapter", body.lora_name] += 1
        return PlainTextResponse(message)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        body = await parse_body(request, UnloadLoraAdapterRequest)
        return PlainTextResponse(registry.unload_adapter(body.lora_name))

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> JSONResponse:
        """vLLM's developer route, for the one worker method the built-in server has: new full weights, in place."""
        body = await parse_body(request, CollectiveRpcRequest)
        if body.method != UPDATE_METHOD:
            raise APIError(
                f"the built-in server has no worker method {body.method!r}; it runs {UPDATE_METHOD!r} only",
                param="method",
            )
        path = body.args[0] if body.args else body.kwargs.get("path", "")
        result = await asyncio.to_thread(registry.update_base_weights, path, service.engine.between_steps)
        counts.loads["weights", registry.base.name] += 1
        return JSONResponse({"results": [result]})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        """Nothing to drop: the built-in server keeps no prompt state between requests (vLLM's answer shape)."""
        return JSONResponse({"success": True})

    return app


async def until_disconnected(request: Request, work: Awaitable[Result]) -> Result | None:
    """`work`'s result, or None when the client disconnects first: then `work` is cancelled (a request it waits on in
    the engine is dropped there). The request's body must have been read: the listener takes the connection's next
    ASGI message, which is then its `http.disconnect`."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait((task, listener), return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None


async def client_gone(request: Request) -> None:
    """Return once the client has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def prometheus_text(counts: ServerMetrics, generation_tokens: Mapping[tuple[str], int]) -> str:
    """The metrics in Prometheus' text exposition format (names as vLLM's where it has one: its
    `vllm:generation_tokens_total` is our `prime_lab_generation_tokens_total`)."""
    families: tuple[tuple[str, str, tuple[str, ...], Mapping[Any, int]], ...] = (
        ("prime_lab_requests_total", "Completion requests answered, by route and model name.",
         ("route", "model"), counts.answered),
        ("prime_lab_requests_cancelled_total",
         "Completion requests whose client disconnected before the answer (generation stopped), by route and model.",
         ("route", "model"), counts.cancelled),
        ("prime_lab_requests_failed_total",
         "Completion requests answered with an error (4xx, 5xx), by route and status.",
         ("route", "status"), counts.failed),
        ("prime_lab_prompt_tokens_total", "Prompt tokens of the requests answered, by model name.",
         ("model",), counts.prompt_tokens),
        ("prime_lab_generation_tokens_total", "Tokens generated, by model name (cancelled requests' included).",
         ("model",), generation_tokens),
        ("prime_lab_policy_loads_total", "LoRA adapters (by name) and full weights loaded at runtime.",
         ("kind", "name"), counts.loads),
    )  # fmt: skip
    lines = []
    for metric, text, names, values in families:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
        for key, n in sorted(values.items()):
            lines.append(f"{metric}{{{labels(names, key)}}} {n}")
    metric = "prime_lab_e2e_request_latency_seconds"
    lines += [f"# HELP {metric} Seconds from a completion request's arrival to its answer, by model name.",
              f"# TYPE {metric} histogram"]  # fmt: skip
    for key, histogram in sorted(counts.latency.items()):
        lines += histogram.lines(metric, labels(("model",), key))
    return "\n".join(lines) + "\n"


def labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f"{k}={json.dumps(v)}" for k, v in zip(names, values, strict=True))
