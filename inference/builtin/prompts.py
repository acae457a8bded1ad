"""Text <-> tokens for the server: chat templates, prompt tokenization, and per-token text for logprobs."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from prime_lab.inference.builtin.errors import APIError
from prime_lab.inference.builtin.tool_calls import hermes_text, template_tool_calls


def flatten_content(content: Any, index: int) -> str | None:
    """A message's content as a string (OpenAI also allows a list of `{"type": "text", "text": ...}` parts)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"messages[{index}].content: only text parts are supported", param=f"messages[{index}]")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError(f"messages[{index}].content must be a string or a list of text parts", param="messages")


def normalise_messages(messages: list[dict[str, Any]], *, inline_tool_calls: bool = False) -> list[dict[str, Any]]:
    """Messages as chat templates take them: text content (none: "", as vLLM renders it), and an assistant's tool
    call arguments as dicts (a `tool` message's `tool_call_id` passes through as it is). An empty `tool_calls` list
    is dropped, so templates take their plain assistant path. `inline_tool_calls` (for a template that never reads
    `tool_calls`): the calls go back into the content as the `<tool_call>` blocks they were parsed from, so the
    model sees the calls it made."""
    normalised = []
    for index, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise APIError(f"messages[{index}] has no role", param="messages")
        rendered = {**message, "content": flatten_content(message.get("content"), index) or ""}
        calls = rendered.pop("tool_calls", None)
        if calls:
            calls = template_tool_calls(calls, index)
            if inline_tool_calls:
                rendered["content"] = "\n".join(filter(None, [rendered["content"], hermes_text(calls)]))
            else:
                rendered["tool_calls"] = calls
        normalised.append(rendered)
    return normalised


class PromptCodec:
    """Wraps a Hugging Face tokenizer with what the routes need."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # a template that never reads an assistant's `tool_calls` sees them as the text blocks they came from
        self.inline_tool_calls = "tool_calls" not in str(tokenizer.chat_template or "")
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    def chat_prompt_ids(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The token ids of the rendered chat. `tools` (OpenAI function schemas) go to the template as its `tools`
        variable, over any `tools` in `template_kwargs`: the tools shown are the tools whose calls are parsed."""
        if self.tokenizer.chat_template is None:
            raise APIError("this model has no chat template; use /v1/completions", param="messages")
        if add_generation_prompt and continue_final_message:
            raise APIError("add_generation_prompt and continue_final_message cannot both be true")
        messages = normalise_messages(messages, inline_tool_calls=self.inline_tool_calls)
        if tools is not None:
            template_kwargs = {**(template_kwargs or {}), "tools": tools}
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(template_kwargs or {}),
            )
        except APIError:
            raise
        except Exception as error:  # a template can raise anything (jinja errors, raise_exception(...))
            raise APIError(f"the chat template could not render these messages: {error}", param="messages") from error
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def text_prompt_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def _token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)
