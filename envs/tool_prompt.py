"""Tools the model can see: whether a model's chat template shows it the `tools` of a request, and a fallback that
writes them into the system prompt.

An environment with tools (prime-lab's `ToolEnv`, a verifiers `ToolEnv`) sends their OpenAI schemas with each
request (`tools=[...]`), and the server renders them into the prompt through the model's chat template. Some
templates never read `tools` (SmolLM2's, the tiny test models'): the model is then never shown a tool, while the
evaluation or the run goes on as if it were. `template_shows_tools` renders a sample conversation with and without
a tool; the same text means the template drops them.

`ToolPrompts` decides once per environment what a run or an evaluation does about it, and says so in one line:
nothing where the environment has no tools, the template renders them, or the environment's system prompt already
names every tool (prime-lab's `ToolEnv` writes them there); otherwise a WARNING naming the environment, the model and
the setting, `[sampling] tools_in_system_prompt = true`, which writes the schemas into each row's system message in
the Hermes format that Qwen2.5's template renders (`tools_block`): the schemas inside `<tools></tools>`, each call
answered as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the blocks vLLM's `hermes` tool-call parser
and the built-in server (inference/builtin/tool_calls.py) turn into `tool_calls`. The requests still carry `tools`,
so the server still parses the calls. A model whose tokenizer is not on this machine (an external endpoint) cannot
be checked: an INFO line says so, and the setting writes the schemas anyway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

SETTING = "[sampling] tools_in_system_prompt = true"
KEY = "tools_in_system_prompt"  # the setting among a job's sampling args (GEPA's, prime eval run's): ours, never sent

SAMPLE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SAMPLE_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "What is the weather in Paris?"}]

# Qwen2.5's words for its tools (its chat template writes them into the system message), which Hermes-style models
# were trained on; the call format is the one the tool-call parser reads.
CALL_FORMAT = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
_BLOCK_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_BLOCK_TAIL = ("</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n" + CALL_FORMAT)


def template_shows_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the `tools` it is given: a sample conversation rendered with a
    tool differs from the same conversation without. A template that fails either way shows none."""
    def render(**tools: Any) -> str | None:
        try:
            return str(tokenizer.apply_chat_template(SAMPLE_MESSAGES, tokenize=False, add_generation_prompt=True,
                                                     **tools))
        except Exception:  # a template can raise anything (jinja errors, raise_exception(...))
            return None

    shown = render(tools=[SAMPLE_TOOL])
    return shown is not None and shown != render()


def tools_block(tools: Iterable[Mapping[str, Any]]) -> str:
    """The tools' OpenAI schemas as Qwen2.5's template writes them into the system message (Hermes format)."""
    return "\n".join([_BLOCK_HEAD, *(json.dumps(dict(t), ensure_ascii=False) for t in tools), _BLOCK_TAIL])


def openai_tool(tool: Any) -> dict[str, Any] | None:
    """A tool as an OpenAI function schema: one already (`oai_tools`, prime-lab's `tool_schemas`), or verifiers'
    `vf.Tool` (`tool_defs`: name, description, parameters) as an object or its dump; None for anything else."""
    dump = getattr(tool, "model_dump", None)
    if callable(dump):
        tool = dump()
    if not isinstance(tool, Mapping):
        return None
    if isinstance(tool.get("function"), Mapping) and tool["function"].get("name"):
        return {"type": "function", **dict(tool)}
    if isinstance(tool.get("name"), str) and tool["name"]:
        function = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        return {"type": "function", "function": function}
    return None


def _schemas(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list | tuple):
        return []
    return [s for s in (openai_tool(t) for t in tools) if s is not None]


def environment_tools(env: Any) -> list[dict[str, Any]]:
    """The tools an environment sends with its requests, as OpenAI schemas (the first of each name): prime-lab's
    `tool_schemas`, a verifiers environment's `tool_defs` (0.2 on) or `oai_tools` (0.1) in this process or as its
    own interpreter described them (isolated), and the members' of a group."""
    found: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        for attribute in ("tool_schemas", "tool_defs", "oai_tools"):
            for schema in _schemas(getattr(obj, attribute, None)):
                found.setdefault(schema["function"]["name"], schema)
        described = getattr(obj, "description", None)
        if isinstance(described, Mapping):
            for schema in _schemas(described.get("tools")):
                found.setdefault(schema["function"]["name"], schema)
        visit(getattr(obj, "env", None))  # the verifiers environment behind our adapter
        members = getattr(obj, "envs", None)
        for member in members.values() if isinstance(members, Mapping) else members or []:
            visit(member)

    visit(env)
    return list(found.values())


def row_tools(row: Mapping[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row's own tools where it has them (verifiers' `info["tool_defs"]`, or `info["oai_tools"]` in 0.1), else
    the environment's."""
    info = row.get("info")
    if isinstance(info, Mapping):
        for key in ("tool_defs", "oai_tools"):
            own = _schemas(info.get(key))
            if own:
                return own
    return tools


def _system_text(row: Mapping[str, Any]) -> str:
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], Mapping) and prompt[0].get("role") == "system":
        return str(prompt[0].get("content") or "")
    return ""


def names_every_tool(text: str, tools: Iterable[Mapping[str, Any]]) -> bool:
    """Whether `text` names each tool (as a word): a system prompt that describes the tools itself."""
    return all(re.search(rf"(?<![\w.]){re.escape(t['function']['name'])}(?![\w])", text) for t in tools)


def with_tools_in_system_prompt(row: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The row with `tools_block(tools)` at the end of its system message (a system message of its own where it has
    none); the row as it is when it has no tools or its system message already names them all."""
    if not tools or names_every_tool(_system_text(row), tools):
        return row
    prompt = [dict(m) for m in row["prompt"]]
    block = tools_block(tools)
    if prompt and prompt[0].get("role") == "system":
        prompt[0]["content"] = f"{str(prompt[0].get('content') or '').rstrip()}\n\n{block}".lstrip()
    else:
        prompt.insert(0, {"role": "system", "content": block})
    return {**row, "prompt": prompt}


Action = Literal["none", "warn", "system_prompt"]


@dataclass(frozen=True)
class ToolPlan:
    """What happens to one environment's tools: `none`, `warn` (the model will not see them) or `system_prompt`
    (their schemas written into each row's system message); `message` is the line that says so."""

    action: Action
    tools: list[dict[str, Any]]
    message: str | None = None
    level: str = "INFO"

    def rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.action != "system_prompt":
            return rows
        return [with_tools_in_system_prompt(r, row_tools(r, self.tools)) for r in rows]


def plan_tools(env_name: str, tools: list[dict[str, Any]], first_row: Mapping[str, Any] | None, *, model: str,
               shows_tools: bool | None, enabled: bool, setting: str = SETTING) -> ToolPlan:
    """The plan for an environment with `tools` whose rows begin with `first_row`, on a model whose template renders
    tools (`shows_tools`; None: not known, its tokenizer is not here)."""
    if first_row is not None:
        tools = row_tools(first_row, tools)
    names = ", ".join(t["function"]["name"] for t in tools[:5]) + (", ..." if len(tools) > 5 else "")
    what = f"environment {env_name} has {len(tools)} tool{'s' if len(tools) != 1 else ''} ({names})"
    if not tools or shows_tools or names_every_tool(_system_text(first_row or {}), tools):
        return ToolPlan("none", tools)
    if shows_tools is None:
        if enabled:
            return ToolPlan("system_prompt", tools, f"{what}; {model}'s chat template cannot be checked here (its "
                            "tokenizer is not on this machine): their schemas go into the system prompt "
                            f"({setting})")
        return ToolPlan("none", tools, f"{what}; whether {model}'s chat template shows them cannot be checked here "
                        f"(its tokenizer is not on this machine); if it does not, set {setting}")
    if enabled:
        return ToolPlan("system_prompt", tools, f"{what} and {model}'s chat template does not render tools: their "
                        f"schemas go into the system prompt in the Hermes <tools> format ({setting})")
    return ToolPlan("warn", tools, f"{what}, but {model}'s chat template does not render tools: the model is never "
                    f"shown them. Set {setting} to write their schemas into the system prompt (Hermes <tools> "
                    "format, calls read from <tool_call> blocks), or use a model whose template renders tools",
                    "WARNING")


class ToolPrompts:
    """A run's or an evaluation's tools: each environment planned once (`plan_tools`) when its rows are first asked
    for, its line logged once; the model's tokenizer loaded (`tokenizer()`; None, or one that raises: not checked)
    only when an environment has tools its system prompt does not name."""

    def __init__(self, model: str, tokenizer: Callable[[], Any | None], *, enabled: bool,
                 log: Callable[[str, str], None], setting: str = SETTING) -> None:
        self.model, self.tokenizer, self.enabled, self.log, self.setting = model, tokenizer, enabled, log, setting
        self._shows_tools: bool | None = None
        self._checked = False
        self._plans: dict[int, ToolPlan] = {}
        self._said: set[str] = set()

    def shows_tools(self) -> bool | None:
        if not self._checked:
            self._checked = True
            try:
                tokenizer = self.tokenizer()
            except Exception:  # a folder that is not a model, a broken tokenizer: the template is not checked
                tokenizer = None
            self._shows_tools = None if tokenizer is None else template_shows_tools(tokenizer)
        return self._shows_tools

    def plan(self, env_name: str, env: Any, rows: list[dict[str, Any]]) -> ToolPlan:
        plan = self._plans.get(id(env))
        if plan is None:
            first = rows[0] if rows else None
            tools = environment_tools(env)
            tools = row_tools(first, tools) if first is not None else tools
            if not tools or names_every_tool(_system_text(first or {}), tools):  # no tokenizer needed
                plan = ToolPlan("none", tools)
            else:
                plan = plan_tools(env_name, tools, first, model=self.model, shows_tools=self.shows_tools(),
                                  enabled=self.enabled, setting=self.setting)
            self._plans[id(env)] = plan
            if plan.message is not None and plan.message not in self._said:
                self._said.add(plan.message)
                self.log(plan.message, plan.level)
        return plan

    def rows(self, env_name: str, env: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows as the environment's plan has them (the schemas in their system messages, or as they are)."""
        return self.plan(env_name, env, rows).rows(rows)
