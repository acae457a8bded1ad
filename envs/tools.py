"""`ToolEnv`: Python functions as tools the model calls; results (or errors) go back as tool messages.

Every request carries the tools' OpenAI schemas (`tools=[...]`) and tool calls are read from the response's native
`tool_calls`; a model that answers in text instead is read as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the Hermes/Qwen convention, which the system prompt also describes), so the environment runs against any
OpenAI-compatible endpoint, small local models included. Results go back as `tool` messages with the call's
`tool_call_id`. Servers differ in what they take, and a 400 about tools moves an endpoint one step down this list
(remembered per endpoint, so only its first requests pay for it; `state["tool_protocol"]` says which step a rollout
used):

- `native`: `tools`, tool_choice left to the server (auto). OpenAI; vLLM started with `--enable-auto-tool-choice
  --tool-call-parser ...` (it parses the model's calls into `tool_calls`); prime-lab's built-in server, which parses
  `<tool_call>` blocks as vLLM's hermes parser does.
- `template`: `tools` with `tool_choice: "none"`. vLLM without `--enable-auto-tool-choice` refuses "auto" but takes
  this: the chat template still shows the model its tools, and the calls come back as text.
- `text`: no `tools` at all, for servers that refuse the field.

A tool that needs its rollout's `state` (a sandbox the rollout opened, what an earlier call left) declares it as a
keyword-only parameter, `def python(code: str, *, state: State) -> str`: it gets the rollout's state and the model
never sees the parameter. What such a tool takes, `MultiTurnEnv.cleanup_state` gives back when the rollout ends.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from prime_lab.envs.environment import MultiTurnEnv, SamplingArgs, State
from prime_lab.envs.parsers import Messages

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


STATE_PARAMETER = "state"  # a tool's keyword-only parameter that gets the rollout's state (hidden from the model)


def takes_state(func: Callable[..., Any]) -> bool:
    """Whether the tool `func` declares a keyword-only `state` parameter (the rollout's state)."""
    param = inspect.signature(func).parameters.get(STATE_PARAMETER)
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function schema of a Python function (types from hints, description from the docstring); a
    keyword-only `state` parameter is left out (the rollout's state, which the environment passes)."""
    hints = get_type_hints(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if name == STATE_PARAMETER and param.kind is inspect.Parameter.KEYWORD_ONLY:
            continue
        properties[name] = {"type": _JSON_TYPES.get(hints.get(name, str), "string")}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    doc = inspect.getdoc(func) or ""
    return {"type": "function", "function": {"name": func.__name__, "description": doc.split("\n\n")[0],
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def parse_tool_calls(message: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(name, arguments or an error string, call id) for each tool call in an assistant message: its native
    `tool_calls`, or else the `<tool_call>` blocks in its text."""
    calls: list[tuple[str, Any, str]] = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function", {})
        raw = fn.get("arguments")
        try:
            args: Any = raw if isinstance(raw, dict) else json.loads(raw or "{}")
        except ValueError:
            args = f"arguments are not valid JSON: {raw!r}"
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


# How a request offers the tools, most capable first (see the module docstring).
TOOL_PROTOCOLS = ("native", "template", "text")
_ABOUT_TOOLS = re.compile(r"\btools?\b|tool[ _]choice", re.IGNORECASE)


def refuses_tools(exc: Exception) -> bool:
    """Whether `exc` is the endpoint answering 400 to the tools in the request (vLLM: '"auto" tool choice requires
    --enable-auto-tool-choice ...'; the built-in server: 'does not support: tools')."""
    return getattr(exc, "status_code", None) == 400 and bool(_ABOUT_TOOLS.search(str(exc)))


class ToolEnv(MultiTurnEnv):
    def __init__(self, tools: list[Callable[..., Any]], system_prompt: str | None = None, max_turns: int = 5,
                 **kwargs: Any) -> None:
        self.tools = {t.__name__: t for t in tools}
        self.tool_schemas = [tool_schema(t) for t in tools]
        self._protocols: dict[str, str] = {}  # endpoint -> the protocol it takes (absent: not known yet)
        described = (system_prompt or "").rstrip() + "\n\n" + self.tool_instructions()
        super().__init__(system_prompt=described.strip(), max_turns=max_turns, **kwargs)

    def tool_instructions(self) -> str:
        return ("You can call these tools:\n" + "\n".join(json.dumps(s["function"]) for s in self.tool_schemas)
                + '\nTo call one, write <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> and wait for '
                "the result. When you have the final answer, reply without a tool call.")

    async def get_model_response(self, client: Any, model: str, messages: Messages, sampling: SamplingArgs,
                                 state: State) -> Any:
        endpoint = str(getattr(client, "base_url", "") or id(client))
        kwargs = sampling.request_kwargs()
        while True:
            protocol = self._protocols.get(endpoint, "native" if self.tool_schemas else "text")
            offer: dict[str, Any] = {}
            if protocol != "text":
                offer["tools"] = self.tool_schemas
            if protocol == "template":
                offer["tool_choice"] = "none"
            try:
                response = await client.chat.completions.create(model=model, messages=messages, **kwargs, **offer)
            except Exception as exc:
                if protocol == "text" or not refuses_tools(exc):
                    raise
                # One step below the protocol refused; a concurrent rollout may already have gone further down.
                known = TOOL_PROTOCOLS.index(self._protocols.get(endpoint, "native"))
                self._protocols[endpoint] = TOOL_PROTOCOLS[max(known, TOOL_PROTOCOLS.index(protocol) + 1)]
                continue
            self._protocols.setdefault(endpoint, protocol)
            state["tool_protocol"] = protocol
            return response

    async def is_completed(self, messages: Messages, state: State) -> bool:
        last = messages[-1]
        return last.get("role") == "assistant" and not parse_tool_calls(last)

    async def call_tool(self, name: str, args: Any, state: State | None = None) -> str:
        if isinstance(args, str):
            return f"Error: {args}"
        tool = self.tools.get(name)
        if tool is None:
            return f"Error: unknown tool '{name}'; available: {', '.join(self.tools)}"
        if not isinstance(args, dict):
            return "Error: arguments must be a JSON object"
        if takes_state(tool):
            args = {**args, STATE_PARAMETER: state if state is not None else {}}
        try:
            result = tool(**args)
            if inspect.isawaitable(result):
                result = await result
            return str(result)
        except Exception as exc:  # a tool error goes back to the model, as a tool result
            return f"Error: {type(exc).__name__}: {exc}"

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        calls = parse_tool_calls(messages[-1])
        results = await asyncio.gather(*(self.call_tool(name, args, state) for name, args, _ in calls))
        state["tool_calls"] = state.get("tool_calls", 0) + len(calls)
        return [{"role": "tool", "tool_call_id": call_id, "content": result}
                for (_, _, call_id), result in zip(calls, results, strict=True)], state
