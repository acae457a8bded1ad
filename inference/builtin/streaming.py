"""`stream=true` on `/v1/chat/completions` and `/v1/completions`: the answer as a server-sent event stream of
OpenAI chunks, ended by `data: [DONE]`, as vLLM and OpenAI send it (what the `openai` client's `stream=True` reads,
and what verifiers 0.4's chat program always asks for).

The built-in engine hands a request its tokens when the request is done, so the stream carries the whole answer:
per choice, one chunk with the role, the text (or a text completion's text), the tool calls (each with its `index`),
the logprobs and the token ids where asked; then one with its finish reason; then, with `stream_options:
{"include_usage": true}`, a last chunk with no choices and the usage. The time to the first chunk is the time to the
whole answer. A request that is refused is refused before the stream starts (a JSON error, as without `stream`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

CHUNK_FIELDS = ("id", "created", "model", "system_fingerprint")  # of the answer, repeated in every chunk


def chat_chunks(answer: Mapping[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk`s of a whole `chat.completion` answer."""
    for choice in answer["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        body = {"index": choice["index"], "delta": delta, "logprobs": choice.get("logprobs"), "finish_reason": None}
        if choice.get("token_ids") is not None:
            body["token_ids"] = choice["token_ids"]
        yield _chunk(answer, "chat.completion.chunk", [body],
                     prompt_token_ids=answer.get("prompt_token_ids") if choice["index"] == 0 else None)
        yield _chunk(answer, "chat.completion.chunk", [_finish(choice, delta={})])
    if include_usage:
        yield _chunk(answer, "chat.completion.chunk", [], usage=answer["usage"])


def completion_chunks(answer: Mapping[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a whole `text_completion` answer (its object stays `text_completion`, as OpenAI's)."""
    for choice in answer["choices"]:
        body = {key: value for key, value in choice.items() if key not in ("finish_reason", "stop_reason")}
        yield _chunk(answer, "text_completion", [{**body, "finish_reason": None}])
        yield _chunk(answer, "text_completion", [_finish(choice, text="", logprobs=None)])
    if include_usage:
        yield _chunk(answer, "text_completion", [], usage=answer["usage"])


def event_stream(chunks: Iterable[Mapping[str, Any]]) -> bytes:
    """Server-sent events: `data: <chunk>` each, then `data: [DONE]`."""
    return b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks) + b"data: [DONE]\n\n"


def _finish(choice: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    return {"index": choice["index"], **fields, "finish_reason": choice["finish_reason"],
            "stop_reason": choice.get("stop_reason")}


def _chunk(answer: Mapping[str, Any], kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    out = {key: answer.get(key) for key in CHUNK_FIELDS}
    out.update(object=kind, choices=choices, usage=extra.pop("usage", None))
    out.update({key: value for key, value in extra.items() if value is not None})
    return out
