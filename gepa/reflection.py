"""The reflection step: our prompt to the reflection model, and pulling the proposed text out of its reply."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

REFLECTION_PROMPT = """You improve the instructions given to an AI assistant.

The assistant was given this {component}:
```
{current}
```

Here are some tasks it was given with these instructions, what it answered, the score it got (higher is better)
and, where known, the expected answer and other feedback:
{examples}

Study where the assistant went wrong and what the good answers have in common. Then write a new {component}
that would make it do better on tasks like these: keep what works, state the exact output format required, and add
any specific knowledge or strategy the examples show it lacks. Do not mention these particular examples.

Reply with the new {component} only, between a pair of triple backticks (```)."""

_FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.DOTALL)


def format_examples(records: Sequence[dict[str, Any]]) -> str:
    parts = []
    for n, record in enumerate(records, 1):
        lines = [f"# Example {n}"]
        for key, value in record.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
            lines.append(f"## {key}\n{text}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def reflection_prompt(component: str, current: str, records: Sequence[dict[str, Any]]) -> str:
    return REFLECTION_PROMPT.format(component=component.replace("_", " "), current=current,
                                    examples=format_examples(records))


def parse_proposal(reply: str, current: str) -> str:
    """The text between the first pair of fences (the longest if several); the whole reply when unfenced;
    the current text when the reply is empty."""
    blocks = [b.strip() for b in _FENCE.findall(reply or "")]
    blocks = [b for b in blocks if b]
    if blocks:
        return max(blocks, key=len)
    text = (reply or "").strip().strip("`").strip()
    return text or current
