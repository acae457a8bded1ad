"""Helpers of the end-to-end SFT tests: a chat dataset a tiny model can fit, an SFT config over it, and
`prime sft run` as a user runs it."""

from __future__ import annotations

import json
import random
from pathlib import Path

from prime_lab.runs.registry import Run
from tests.support.rl_runs import start

LETTERS = "abcdefgh"


def write_dataset(path: Path, n: int = 48, seed: int = 0) -> Path:
    """`n` chats in the `messages` shape: reverse a short string of letters (system, user, assistant)."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
            fh.write(json.dumps({"messages": [{"role": "system", "content": "Reverse it."},
                                              {"role": "user", "content": word},
                                              {"role": "assistant", "content": word[::-1]}]}) + "\n")
    return path


def write_sft_config(path: Path, model: Path | str, data: Path, *, steps: int = 8, extra: str = "",
                     checkpoint_interval: int = 2, lr: float = 5e-3) -> Path:
    path.write_text(f"""
model = "{model}"
max_steps = {steps}
learning_rate = {lr}

[data]
name = "{data}"
seq_len = 64
batch_size = 2

[val]
interval = 4

[val.data]
name = "{data}"

[lora]
r = 8
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

[checkpoints]
interval = {checkpoint_interval}
{extra}
""")
    return path


def start_sft(config: Path, *extra: str) -> Run:
    return start(config, *extra, kind="sft")


def assistant_spans(text: str, messages: list[dict[str, str]], end_of_turn: str) -> list[tuple[int, int]]:
    """Independently of the SFT data code: each assistant message's characters in a chat template's rendering
    `text`, its content and the `end_of_turn` marker after it (what an assistant-only loss mask trains)."""
    spans, at = [], 0
    for message in messages:
        start = text.index(message["content"], at)
        at = start + len(message["content"])
        if message["role"] == "assistant":
            at = text.index(end_of_turn, at) + len(end_of_turn)
            spans.append((start, at))
    return spans
