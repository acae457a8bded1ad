"""Stand-ins for the verifiers adapter's tests: where the test environments live, scripted models that answer
in-process (an httpx mock transport behind a real AsyncOpenAI client) or over HTTP (tests/envs/scripted.py), and the
interpreter of a stand-in verifiers release (`release_interpreter`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sysconfig
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

VF_ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "verifiers_envs"
TOOL_ARGS = {"tool_a": {"x": 2}, "tool_b": {"text": "abc"}, "tool_c": {"a": 2, "b": 3}, "tool_d": {"city": "Oslo"}}
Model = Callable[[dict[str, Any]], dict[str, Any]]  # request body -> assistant message


def env_folders() -> list[Path]:
    """Each test environment's folder (its module sits inside, as in a verifiers repository)."""
    return [p for p in sorted(VF_ENVS.iterdir()) if (p / "pyproject.toml").is_file()]


def env_path() -> str:
    return os.pathsep.join(str(p) for p in env_folders())


def tool_calling_model(request: dict[str, Any]) -> dict[str, Any]:
    """Calls, natively, the first tool the user's prompt names; once a tool has answered, says it is done."""
    prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
    tool = prompt.split(": ")[1].split(",")[0].split(".")[0]
    assert {t["function"]["name"] for t in request.get("tools") or []} >= {tool}, request.get("tools")
    if any(m["role"] == "tool" for m in request["messages"]):
        return {"role": "assistant", "content": "done"}
    call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": json.dumps(TOOL_ARGS[tool])}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def guessing_model(request: dict[str, Any]) -> dict[str, Any]:
    """Plays vf-guess-game by binary search with native `guess` tool calls; says it found the number once a tool
    reply says so."""
    messages = request["messages"]
    assert any(t["function"]["name"] == "guess" for t in request.get("tools") or []), request.get("tools")
    user = next(m["content"] for m in messages if m["role"] == "user")
    low, high = 1, int(re.search(r"from 1 to (\d+)", user).group(1))  # type: ignore[union-attr]
    for text in (m["content"] for m in messages if m["role"] == "tool"):
        number = int(re.match(r"\d+", text).group())  # type: ignore[union-attr]
        if "higher" in text:
            low = number + 1
        elif "lower" in text:
            high = number - 1
        else:
            return {"role": "assistant", "content": f"Found it: {number}."}
    call = {"id": f"call_{len(messages)}", "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"number": (low + high) // 2})}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def completion(request: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """A chat completion around `message`, with vLLM's token ids and logprobs when the request asks for them
    (prompt ids: one per 5 characters of the conversation; completion ids: one per character, logprob -0.5)."""
    text = message.get("content") or json.dumps(message.get("tool_calls"))
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
    reply = {"id": "x", "object": "chat.completion", "created": 0, "model": request["model"], "choices": [choice],
             "usage": {"prompt_tokens": 10, "completion_tokens": len(text), "total_tokens": 10 + len(text)}}
    if request.get("logprobs") and request.get("return_token_ids"):
        reply["prompt_token_ids"] = list(range(len(json.dumps(request["messages"])) // 5))
        choice["token_ids"] = [ord(c) % 256 for c in text]
        choice["logprobs"] = {"content": [{"token": c, "logprob": -0.5, "bytes": None, "top_logprobs": []}
                                          for c in text]}
    return reply


def mock_client(model: Model, requests: list[dict[str, Any]] | None = None) -> AsyncOpenAI:
    """An AsyncOpenAI client whose requests `model` answers in-process (each request body is appended to
    `requests`)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if requests is not None:
            requests.append(body)
        return httpx.Response(200, json=completion(body, model(body)))

    return AsyncOpenAI(base_url="http://stand-in/v1", api_key="x", max_retries=0,
                       http_client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))


def release_interpreter(folder: Path, version: str, files: dict[str, str]) -> Path:
    """The interpreter of a stand-in verifiers release: a virtual environment without pip (~0.1 s) whose own
    site-packages hold `files` (path -> text; `verifiers/__init__.py` the stand-in) and verifiers `version`'s metadata,
    with the project's packages (pyzmq, msgpack, openai) after them through a `.pth` file."""
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after its own site-packages
    (site / f"verifiers-{version}.dist-info").mkdir()
    (site / f"verifiers-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verifiers\n"
                                                                      f"Version: {version}\n")
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return python
