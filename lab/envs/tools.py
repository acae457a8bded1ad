"""`ToolEnv`: Python functions as tools the model calls; results (or errors) go back as tool messages.

Tool calls are read from the endpoint's native `tool_calls` when it returns them, and otherwise from the text, as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes/Qwen convention), so the environment runs
against any OpenAI-compatible endpoint, small local models included. The tool descriptions go in the system prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from prime_lab.lab.envs.environment import MultiTurnEnv, State
from prime_lab.lab.envs.parsers import Messages

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function schema of a Python function (types from hints, description from the docstring)."""
    hints = get_type_hints(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        properties[name] = {"type": _JSON_TYPES.get(hints.get(name, str), "string")}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    doc = inspect.getdoc(func) or ""
    return {"type": "function", "function": {"name": func.__name__, "description": doc.split("\n\n")[0],
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def parse_tool_calls(message: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(name, arguments or an error string, call id) for each tool call in an assistant message."""
    calls: list[tuple[str, Any, str]] = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function", {})
        try:
            args: Any = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = f"arguments are not valid JSON: {fn.get('arguments')!r}"
        calls.append((str(fn.get("name", "")), args, str(call.get("id") or f"call_{i}")))
    if calls:
        return calls
    for i, raw in enumerate(_CALL_RE.findall(str(message.get("content") or ""))):
        try:
            obj = json.loads(raw)
            calls.append((str(obj.get("name", "")), obj.get("arguments", {}), f"call_{i}"))
        except (ValueError, AttributeError):
            calls.append(("", f"tool call is not valid JSON: {raw[:200]!r}", f"call_{i}"))
    return calls


class ToolEnv(MultiTurnEnv):
    def __init__(self, tools: list[Callable[..., Any]], system_prompt: str | None = None, max_turns: int = 5,
                 **kwargs: Any) -> None:
        self.tools = {t.__name__: t for t in tools}
        self.tool_schemas = [tool_schema(t) for t in tools]
        described = (system_prompt or "").rstrip() + "\n\n" + self.tool_instructions()
        super().__init__(system_prompt=described.strip(), max_turns=max_turns, **kwargs)

    def tool_instructions(self) -> str:
        return ("You can call these tools:\n" + "\n".join(json.dumps(s["function"]) for s in self.tool_schemas)
                + '\nTo call one, write <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> and wait for '
                "the result. When you have the final answer, reply without a tool call.")

    async def is_completed(self, messages: Messages, state: State) -> bool:
        last = messages[-1]
        return last.get("role") == "assistant" and not parse_tool_calls(last)

    async def call_tool(self, name: str, args: Any) -> str:
        if isinstance(args, str):
            return f"Error: {args}"
        tool = self.tools.get(name)
        if tool is None:
            return f"Error: unknown tool '{name}'; available: {', '.join(self.tools)}"
        if not isinstance(args, dict):
            return "Error: arguments must be a JSON object"
        try:
            result = tool(**args)
            if inspect.isawaitable(result):
                result = await result
            return str(result)
        except Exception as exc:  # a tool error goes back to the model, as a tool result
            return f"Error: {type(exc).__name__}: {exc}"

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        calls = parse_tool_calls(messages[-1])
        results = await asyncio.gather(*(self.call_tool(name, args) for name, args, _ in calls))
        state["tool_calls"] = state.get("tool_calls", 0) + len(calls)
        return [{"role": "tool", "tool_call_id": call_id, "content": result}
                for (_, _, call_id), result in zip(calls, results, strict=True)], state
