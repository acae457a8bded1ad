"""Parsers turn a model's completion into the answer a reward function compares (verifiers' classic names)."""

from __future__ import annotations

import re
from typing import Any

Messages = list[dict[str, Any]]

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


def last_assistant_text(completion: Messages | str) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


class Parser:
    """The plain parser: the answer is the last assistant message, stripped."""

    def parse(self, text: str) -> str | None:
        return text.strip()

    def parse_answer(self, completion: Messages | str) -> str | None:
        return self.parse(last_assistant_text(completion))

    def format_hint(self) -> str:
        return ""


class ThinkParser(Parser):
    """Drops `<think>...</think>` reasoning (and anything before a lone `</think>`) before parsing."""

    def __init__(self, inner: Parser | None = None) -> None:
        self.inner = inner or Parser()

    def parse(self, text: str) -> str | None:
        text = _THINK_RE.sub("", text)
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        return self.inner.parse(text)

    def format_hint(self) -> str:
        return self.inner.format_hint()


class XMLParser(Parser):
    """Reads `<field>...</field>` tags; `answer_field` is the one `parse` returns (the last occurrence wins)."""

    def __init__(self, fields: list[str], answer_field: str | None = None) -> None:
        if not fields:
            raise ValueError("XMLParser needs at least one field")
        self.fields = fields
        self.answer_field = answer_field or fields[-1]

    def parse_fields(self, text: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name in self.fields:
            matches = re.findall(rf"<{name}>\s*(.*?)\s*</{name}>", text, re.DOTALL)
            if not matches:  # an unclosed final tag (the model ran out of tokens) still counts
                tail = re.search(rf"<{name}>\s*(.*)$", text, re.DOTALL)
                matches = [tail.group(1).strip()] if tail else []
            out[name] = matches[-1] if matches else None
        return out

    def parse(self, text: str) -> str | None:
        return self.parse_fields(text)[self.answer_field]

    def format_hint(self) -> str:
        return "Respond in this format:\n" + "\n".join(f"<{f}>\n...\n</{f}>" for f in self.fields)

    def format_reward(self, completion: Messages | str) -> float:
        """Share of the fields present in the last assistant message (a common shaping reward)."""
        fields = self.parse_fields(last_assistant_text(completion))
        return sum(v is not None for v in fields.values()) / len(self.fields)
