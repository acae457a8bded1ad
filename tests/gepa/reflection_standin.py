"""A deterministic reflection model for end-to-end GEPA tests: the scripted endpoint of tests/envs, answering
with a function of the prompt it is sent (not of arrival order, which parallel proposals make vary), optionally
after a delay so that a test can stop a run while reflections are in flight."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.envs.scripted import ScriptedEndpoint, scripted_endpoint


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


def write_gepa_config(path: Path, server: Any, reflection: ScriptedEndpoint, env_id: str, **gepa: int) -> Path:
    """A `prime gepa run` config: the task model served by `server` (8 tokens, greedy), the reflection stand-in at
    `reflection`, and these `[gepa]` settings (minibatch_size 2 unless given)."""
    settings = {"minibatch_size": 2, **gepa}
    path.write_text(f'model = "{server.model_name}"\nreflection_model = "stand-in"\n'
                    f'base_url = "{server.base_url}"\nreflection_base_url = "{reflection.base_url}"\n'
                    f'[env]\nid = "{env_id}"\n[gepa]\n' + "".join(f"{k} = {v}\n" for k, v in settings.items())
                    + "[sampling]\nmax_tokens = 8\ntemperature = 0.0\n")
    return path
