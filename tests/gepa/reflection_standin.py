"""A deterministic reflection model for end-to-end GEPA tests: the scripted endpoint of tests/lab/envs, answering
with a function of the prompt it is sent (not of arrival order, which parallel proposals make vary), optionally
after a delay so that a test can stop a run while reflections are in flight."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.lab.envs.scripted import ScriptedEndpoint, scripted_endpoint


def proposal_for(prompt: str) -> str:
    tag = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    return (f"```\nReverse the text character by character (variant {tag}). "
            "Answer inside <reversed_text> tags.\n```")


@contextmanager
def reflection_standin(delay: float = 0.0) -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint([]) as endpoint:
        def reply(request: dict[str, Any]) -> dict[str, Any]:
            with endpoint.lock:
                endpoint.requests.append(request)
            time.sleep(delay)
            content = proposal_for(request["messages"][-1]["content"])
            return {"id": "standin", "object": "chat.completion", "created": 0, "model": request.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}

        endpoint.next_reply = reply  # type: ignore[method-assign]
        yield endpoint
