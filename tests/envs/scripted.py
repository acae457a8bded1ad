"""A scripted OpenAI-compatible endpoint for unit tests of environment logic (not of any model server).

Each request pops the next reply from a queue: a string (the assistant's content), `None` (an empty reply), a dict
(the assistant message itself, e.g. with native `tool_calls`; finish_reason "tool_calls" when it has them), or the
string "!malformed" (a 200 answer without choices). It records every request body it was sent. A request with
`stream: true` gets the reply as an event stream of chunks (`streamed`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedEndpoint:
    def __init__(self, replies: list[str | None | dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.base_url = ""

    def next_reply(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(request)
            content = self.replies.pop(0) if self.replies else "(no more replies)"
        if content == "!malformed":
            return {"id": "x", "object": "chat.completion", "created": 0, "model": request.get("model"),
                    "choices": []}
        message = {"role": "assistant", **content} if isinstance(content, dict) else \
            {"role": "assistant", "content": content}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": request.get("model"),
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def streamed(reply: dict[str, Any]) -> str:
    """A reply as the event stream a `stream=true` request gets: one chunk with the whole message as its delta
    (tool calls with their index), one with the finish reason, then `[DONE]`."""
    def chunk(choices: list[dict[str, Any]]) -> str:
        return "data: " + json.dumps({"id": reply["id"], "object": "chat.completion.chunk", "created": 0,
                                      "model": reply["model"], "choices": choices}) + "\n\n"

    events = []
    for choice in reply["choices"]:
        delta = dict(choice["message"])
        if delta.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
        events.append(chunk([{"index": choice["index"], "delta": delta, "finish_reason": None}]))
        events.append(chunk([{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}]))
    return "".join(events) + "data: [DONE]\n\n"


@contextmanager
def scripted_endpoint(replies: list[str | None | dict[str, Any]]) -> Iterator[ScriptedEndpoint]:
    endpoint = ScriptedEndpoint(replies)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            reply = endpoint.next_reply(body)
            payload = (streamed(reply) if body.get("stream") else json.dumps(reply)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if body.get("stream") else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
