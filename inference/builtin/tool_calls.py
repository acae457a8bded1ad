"""Tool calling as vLLM serves it with `--enable-auto-tool-choice --tool-call-parser hermes`.

The tools reach the model through the chat template (`apply_chat_template(..., tools=...)`); what the model writes
back is plain text, in which each call is a `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block (the
Hermes/Qwen convention). With `tool_choice` "auto" (the default when `tools` are given) those blocks become the
message's `tool_calls`; with "none" the tools are still rendered and the text comes back untouched. "required" and a
named function need constrained decoding, which the built-in server does not have: they are refused.

Only the response message changes: the token ids and logprobs describe the generated tokens, whatever the parse.
Calls are parsed from whole texts (a `stream=true` answer carries them whole too: streaming.py).
Unlike vLLM's hermes parser, which sets `skip_special_tokens=false` for tool requests, the text is decoded as the
request asks: a model whose `<tool_call>` is a special token needs `skip_special_tokens: false` (Qwen2.5 and Qwen3
mark it as an ordinary added token).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from prime_lab.inference.builtin.errors import APIError

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
# A closed block, or an unclosed one running to the end of the text (generation stopped inside it).
_BLOCK = re.compile(rf"{TOOL_CALL_START}(.*?){TOOL_CALL_END}|{TOOL_CALL_START}(.*)\Z", re.DOTALL)

SUPPORTED_TOOL_CHOICES = ("auto", "none")


@dataclass(frozen=True)
class ParsedToolCalls:
    """An assistant text split into its tool calls (OpenAI's shape) and the remaining content."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_hermes_tool_calls(text: str) -> ParsedToolCalls:
    """The `<tool_call>` blocks of `text` as OpenAI tool calls, and the text without them as content.

    A block whose body is not a JSON object with a string `name` (and, if present, an object `arguments`) is not a
    call: it stays in the content as the model wrote it. Content that is empty or only whitespace once the calls are
    removed is None, as OpenAI returns it for a message that only calls tools.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    end = 0
    for match in _BLOCK.finditer(text):
        call = _call_from_json(match.group(1) if match.group(1) is not None else match.group(2))
        if call is None:
            continue
        kept.append(text[end : match.start()])
        end = match.end()
        calls.append(call)
    if not calls:
        return ParsedToolCalls(content=text)
    kept.append(text[end:])
    content = "".join(kept).strip()
    return ParsedToolCalls(content=content or None, tool_calls=calls)


def _call_from_json(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def parses_tool_calls(tools: list[dict[str, Any]] | None, tool_choice: Any) -> bool:
    """Whether a request's output is parsed for tool calls; a 400 for tools or a tool_choice this server refuses.

    As vLLM: tool_choice defaults to "auto" when tools are given; a tool_choice other than "none" needs tools.
    """
    if tools is not None:
        if not tools:
            raise APIError(
                "`tools` must not be an empty array; give at least one tool or leave the field out", param="tools"
            )
        for index, tool in enumerate(tools):
            function = tool.get("function") if tool.get("type", "function") == "function" else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
                raise APIError(
                    f'tools[{index}] must be {{"type": "function", "function": {{"name": ..., '
                    '"parameters": {...}}}}',
                    param=f"tools[{index}]",
                )
    if tool_choice is None:
        return bool(tools)
    if tool_choice == "none":
        return False
    if not tools:
        raise APIError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if tool_choice == "auto":
        return True
    if tool_choice == "required" or isinstance(tool_choice, dict):
        asked = '"required"' if tool_choice == "required" else "a named function"
        raise APIError(
            f"the built-in server does not support tool_choice {asked} (it needs constrained decoding); "
            'it supports "auto" (calls are parsed from <tool_call> blocks) and "none"',
            param="tool_choice",
        )
    raise APIError(
        f'Invalid value for `tool_choice`: {tool_choice!r}; the built-in server supports "auto" and "none"',
        param="tool_choice",
    )


def template_tool_calls(tool_calls: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as chat templates expect them: `function.arguments` a dict, not the
    JSON string OpenAI sends (vLLM converts them the same way). Arguments that are missing, not valid JSON or not
    an object render as `{}`, so a conversation with one bad call in its history can go on, as in vLLM."""
    if not isinstance(tool_calls, list):
        raise APIError(f"messages[{index}].tool_calls must be a list", param=f"messages[{index}]")
    converted = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise APIError(
                f"messages[{index}].tool_calls: only calls of type 'function' are supported", param=f"messages[{index}]"
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                arguments = {}
        converted.append(
            {**call, "function": {**function, "arguments": arguments if isinstance(arguments, dict) else {}}}
        )
    return converted


def hermes_text(tool_calls: list[dict[str, Any]]) -> str:
    """Calls (as `template_tool_calls` returns them) as the `<tool_call>` blocks `parse_hermes_tool_calls` reads."""
    return "\n".join(f"{TOOL_CALL_START}\n" + json.dumps({"name": call["function"].get("name", ""),
                                                          "arguments": call["function"]["arguments"]},
                                                         ensure_ascii=False) + f"\n{TOOL_CALL_END}"
                     for call in tool_calls)
