"""Tool calling on the built-in server, as vLLM does it with `--enable-auto-tool-choice --tool-call-parser hermes`.

The parser and the request rules are pure functions, tested directly. Through real HTTP: a tiny model whose chat
template renders tools in Qwen's style (the shipped tiny and SmolLM2 templates ignore `tools`) shows that tools and
tool-call history reach the prompt; the real SmolLM2, shown a few tool-calling turns, writes a `<tool_call>` block
of its own under greedy decoding, which shows the parse on generated text.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from prime_lab.inference.builtin.completions import chat_message
from prime_lab.inference.builtin.errors import APIError
from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server
from prime_lab.inference.builtin.prompts import normalise_messages
from prime_lab.inference.builtin.sequences import Choice
from prime_lab.inference.builtin.server import BuiltinServerSettings
from prime_lab.inference.builtin.tool_calls import parse_hermes_tool_calls, parses_tool_calls

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [WEATHER_TOOL]

# Qwen2.5's way of rendering tools and tool turns, cut down to ChatML on the tiny model's tokens.
QWEN_TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n# Tools\n\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each call, return a JSON object within <tool_call></tool_call> tags.<|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls is defined %}"
    "{{ '<|im_start|>assistant\n' + (message.content or '') }}"
    "{% for call in message.tool_calls %}"
    '{{ \'<tool_call>\n{"name": "\' + call.function.name + \'", "arguments": \' + (call.function.arguments | tojson)'
    " + '}\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}"
    "{% elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def call_block(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- the parser -------------------------------------------------------------------------------------------------


def test_text_without_tool_calls_is_all_content() -> None:
    parsed = parse_hermes_tool_calls("The weather is fine. <tool_response>x</tool_response>")
    assert parsed.content == "The weather is fine. <tool_response>x</tool_response>" and parsed.tool_calls == []


def test_each_block_becomes_a_call_and_leaves_the_content() -> None:
    text = (
        "Let me look.\n"
        + call_block("get_weather", {"city": "Paris"})
        + "\nand\n"
        + call_block("get_time", {"zone": "Europe/Paris", "format": {"h24": True}})
        + "\nDone."
    )
    parsed = parse_hermes_tool_calls(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"city": "Paris"},
        {"zone": "Europe/Paris", "format": {"h24": True}},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == 2
    assert parsed.content == "Let me look.\n\nand\n\nDone."


def test_a_message_of_calls_only_has_no_content() -> None:
    parsed = parse_hermes_tool_calls(call_block("get_weather", {"city": "Oslo"}) + "\n")
    assert parsed.content is None and len(parsed.tool_calls) == 1


def test_a_block_that_is_not_a_call_stays_in_the_content() -> None:
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    not_a_call = '<tool_call>["get_weather"]</tool_call>'
    text_arguments = '<tool_call>{"name": "get_weather", "arguments": "Paris"}</tool_call>'
    alone = parse_hermes_tool_calls(broken)
    assert alone.content == broken and alone.tool_calls == []
    parsed = parse_hermes_tool_calls(f"{broken} {not_a_call} {text_arguments} " + call_block("f", {}))
    assert [c["function"] for c in parsed.tool_calls] == [{"name": "f", "arguments": "{}"}]
    assert parsed.content == f"{broken} {not_a_call} {text_arguments}"


def test_a_call_left_open_at_the_end_is_read_and_arguments_keep_their_characters() -> None:
    parsed = parse_hermes_tool_calls('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}')
    assert parsed.content == "Sure."
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"city": "Zürich"}'
    assert parse_hermes_tool_calls('<tool_call>{"name": "get_weather", "argu').tool_calls == []


def test_finish_reason_is_tool_calls_only_for_a_call_that_stopped_by_itself() -> None:
    text = call_block("get_weather", {"city": "Paris"})
    stopped = Choice(token_ids=[1, 2, 3], text=text, finish_reason="stop", stop_reason=None)
    cut = Choice(token_ids=[1, 2, 3], text=text, finish_reason="length", stop_reason=None)
    message, finish_reason = chat_message(stopped, parse_tools=True)
    assert finish_reason == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 1
    assert chat_message(cut, parse_tools=True)[1] == "length"
    message, finish_reason = chat_message(stopped, parse_tools=False)
    assert finish_reason == "stop" and message["content"] == text and message["tool_calls"] == []
    plain = Choice(token_ids=[1], text="hello", finish_reason="stop", stop_reason=None)
    assert chat_message(plain, parse_tools=True) == chat_message(plain, parse_tools=False)


# --- what a request may ask -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "tool_choice", "parses"),
    [(None, None, False), (TOOLS, None, True), (TOOLS, "auto", True), (TOOLS, "none", False), (None, "none", False)],
)
def test_tool_choice_auto_parses_and_none_does_not(tools: Any, tool_choice: Any, parses: bool) -> None:
    assert parses_tool_calls(tools, tool_choice) is parses


@pytest.mark.parametrize(
    ("tools", "tool_choice", "message"),
    [
        (TOOLS, "required", 'tool_choice "required"'),
        (TOOLS, {"type": "function", "function": {"name": "get_weather"}}, "a named function"),
        (TOOLS, "sometimes", "Invalid value for `tool_choice`"),
        (None, "auto", "`tools` must be set"),
        ([], None, "must not be an empty array"),
        ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0] must be"),
    ],
)
def test_what_the_server_cannot_do_is_refused_with_what_it_can(tools: Any, tool_choice: Any, message: str) -> None:
    with pytest.raises(APIError) as refused:
        parses_tool_calls(tools, tool_choice)
    assert message in refused.value.message and refused.value.status == 400
    if tool_choice in ("required", "sometimes") or isinstance(tool_choice, dict):
        assert '"auto"' in refused.value.message and '"none"' in refused.value.message


def test_tool_call_arguments_reach_templates_as_dicts() -> None:
    history: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": '}},
                {"id": "c", "type": "function", "function": {"name": "h", "arguments": {"y": [2]}}},
            ],
        },
        {"role": "assistant", "content": "plain", "tool_calls": []},
    ]
    calls = normalise_messages(history)[0]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"x": 1}, {}, {"y": [2]}]
    assert [c["id"] for c in calls] == ["a", "b", "c"]
    assert history[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # the request is not changed
    assert "tool_calls" not in normalise_messages(history)[1]


# --- through HTTP -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_template_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    """The tiny model with a chat template that renders tools (its own ignores them)."""
    model = tmp_path_factory.mktemp("models") / "tiny-qwen3-tools"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(QWEN_TOOLS_TEMPLATE)
    settings = BuiltinServerSettings(model=model, served_model_name="tiny-tools", max_model_len=2048)
    server = start_builtin_server(settings, log_path=tmp_path_factory.mktemp("builtin") / "tools.log", timeout=120)
    yield server
    server.stop()


def post_chat(server: BuiltinServer, **fields: Any) -> httpx.Response:
    body = {
        "model": server.model_name,
        "messages": QUESTION,
        "max_tokens": 4,
        "temperature": 0,
        "return_token_ids": True,
        **fields,
    }
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)


def prompt_text(server: BuiltinServer, **fields: Any) -> str:
    from transformers import AutoTokenizer

    response = post_chat(server, **fields)
    assert response.status_code == 200, response.text
    tokenizer = AutoTokenizer.from_pretrained(server.model_path)
    return str(tokenizer.decode(response.json()["prompt_token_ids"]))


def test_tools_are_rendered_into_the_prompt_with_either_tool_choice(tools_template_server: BuiltinServer) -> None:
    without = prompt_text(tools_template_server)
    auto = prompt_text(tools_template_server, tools=TOOLS)
    none = prompt_text(tools_template_server, tools=TOOLS, tool_choice="none")
    assert "<tools>" not in without and "get_weather" not in without
    assert auto == none
    assert json.dumps(WEATHER_TOOL) in auto and auto.endswith(without)


def test_tool_calls_and_results_in_the_history_are_rendered(tools_template_server: BuiltinServer) -> None:
    history = [*QUESTION,
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]  # fmt: skip
    text = prompt_text(tools_template_server, tools=TOOLS, messages=history)
    # As a dict, the arguments render as an object; left a JSON string, they would render quoted.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice", '"auto"'),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_choice",
            '"none"',
        ),
        ({"tool_choice": "auto"}, "tool_choice", "`tools` must be set"),
    ],
)
def test_unsupported_tool_requests_get_400s_in_the_server_error_format(
    tools_template_server: BuiltinServer, fields: dict[str, Any], param: str, says: str
) -> None:
    response = post_chat(tools_template_server, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert error["param"] == param and says in error["message"]


FEW_SHOT_CITIES = ["Paris", "Tokyo", "Lima"]


def few_shot_tool_calls(city: str) -> list[dict[str, Any]]:
    """Turns in which the assistant answers each weather question with a call, as plain text (SmolLM2's template
    renders no tools), then a new question: a real model continues the pattern."""
    messages: list[dict[str, Any]] = []
    for shown in FEW_SHOT_CITIES:
        messages += [
            {"role": "user", "content": f"What is the weather in {shown}?"},
            {"role": "assistant", "content": call_block("get_weather", {"city": shown})},
        ]
    return [*messages, {"role": "user", "content": f"What is the weather in {city}?"}]


def test_a_call_the_model_writes_comes_back_as_tool_calls_with_its_tokens_intact(
    builtin_smollm2_server: BuiltinServer,
) -> None:
    client = openai.OpenAI(base_url=builtin_smollm2_server.base_url, api_key="unused", max_retries=0, timeout=300)

    request: dict[str, Any] = {
        "model": builtin_smollm2_server.model_name,
        "messages": few_shot_tool_calls("Berlin"),
        "tools": TOOLS,
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }

    def ask(**fields: Any) -> dict[str, Any]:
        return client.chat.completions.create(**request, **fields).model_dump()

    parsed, unparsed = ask(), ask(tool_choice="none")
    raw = unparsed["choices"][0]
    assert raw["finish_reason"] == "stop" and not raw["message"]["tool_calls"]
    assert "<tool_call>" in raw["message"]["content"], f"SmolLM2 did not write a call: {raw['message']['content']!r}"

    choice = parsed["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Berlin"}
    # The RL fields describe the generated tokens, whatever the parse: the same greedy tokens, all of them.
    assert parsed["prompt_token_ids"] == unparsed["prompt_token_ids"]
    assert choice["token_ids"] == raw["token_ids"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert parsed["usage"]["completion_tokens"] == len(choice["token_ids"])
    # streamed (inference/builtin/streaming.py): the same call, whole, with its index, and the same finish reason
    chunks = [c.model_dump()["choices"][0] for c in client.chat.completions.create(**request, stream=True)]
    [streamed] = chunks[0]["delta"]["tool_calls"]
    assert (streamed["index"], streamed["function"]) == (0, call["function"]), chunks
    assert chunks[-1]["finish_reason"] == "tool_calls" and chunks[0]["token_ids"] == choice["token_ids"]


def test_a_template_without_tool_calls_sees_the_calls_as_the_blocks_they_came_from(
    builtin_smollm2_server: BuiltinServer,
) -> None:
    """SmolLM2's template never reads `tool_calls`: a history sent back in OpenAI's form (content None, the calls in
    `tool_calls`) renders as the same tokens as the same history with the calls written as text blocks."""
    client = openai.OpenAI(base_url=builtin_smollm2_server.base_url, api_key="unused", max_retries=0, timeout=300)
    as_text = few_shot_tool_calls("Berlin")
    native = list(as_text)
    for i, city in enumerate(FEW_SHOT_CITIES):
        call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        native[2 * i + 1] = {"role": "assistant", "content": None,
                             "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}]}

    def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
        response = client.chat.completions.create(model=builtin_smollm2_server.model_name, messages=messages,
                                                  tools=TOOLS, max_tokens=1, extra_body={"return_token_ids": True})
        return list(response.model_dump()["prompt_token_ids"])

    assert prompt_ids(native) == prompt_ids(as_text)
