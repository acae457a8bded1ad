"""The HTTP routes (FastAPI): vLLM's OpenAI-compatible surface, with OpenAI-style JSON errors, the two developer
routes a trainer's full weights go through (`/collective_rpc` for `weights.UPDATE_METHOD`, `/reset_prefix_cache`),
and `/metrics`: counters in Prometheus' text format, as vLLM serves its own (ours are named `prime_lab_*`):
requests answered by route and model name, and policy loads (LoRA adapters by name, full weights), so a caller that
spreads requests over several servers can see each one's share."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prime_lab.inference.builtin.completions import CompletionService, model_card
from prime_lab.inference.builtin.errors import APIError, error_body
from prime_lab.inference.builtin.schemas import (
    ChatCompletionRequest,
    CollectiveRpcRequest,
    CompletionRequest,
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
)
from prime_lab.inference.weights import UPDATE_METHOD

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)


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
    answered: Counter[tuple[str, str]] = Counter()  # (route, model) -> requests answered
    loads: Counter[tuple[str, str]] = Counter()  # (kind, name) -> policies loaded

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(error), HTTPStatus.BAD_REQUEST), status_code=HTTPStatus.BAD_REQUEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail), error.status_code), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("request failed")
        status = HTTPStatus.INTERNAL_SERVER_ERROR
        return JSONResponse(error_body(f"{type(error).__name__}: {error}", status), status_code=status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(m, service.max_model_len) for m in registry.served()]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prometheus_text(answered, loads), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        response = await service.chat(await parse_body(request, ChatCompletionRequest))
        answered["chat", response["model"]] += 1
        return JSONResponse(response)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        response = await service.complete(await parse_body(request, CompletionRequest))
        answered["completion", response["model"]] += 1
        return JSONResponse(response)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await parse_body(request, LoadLoraAdapterRequest)
        message = await asyncio.to_thread(registry.load_adapter, body.lora_name, body.lora_path, body.load_inplace)
        loads["adapter", body.lora_name] += 1
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
        loads["weights", registry.base.name] += 1
        return JSONResponse({"results": [result]})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        """Nothing to drop: the built-in server keeps no prompt state between requests (vLLM's answer shape)."""
        return JSONResponse({"success": True})

    return app


def prometheus_text(answered: Counter[tuple[str, str]], loads: Counter[tuple[str, str]]) -> str:
    """The counters in Prometheus' text exposition format."""
    families = (("prime_lab_requests_total", "Completion requests answered, by route and model name.",
                 ("route", "model"), answered),
                ("prime_lab_policy_loads_total", "LoRA adapters (by name) and full weights loaded at runtime.",
                 ("kind", "name"), loads))
    lines = []
    for metric, text, labels, counts in families:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
        for key, n in sorted(counts.items()):
            values = ",".join(f"{k}={json.dumps(v)}" for k, v in zip(labels, key, strict=True))
            lines.append(f"{metric}{{{values}}} {n}")
    return "\n".join(lines) + "\n"
