"""Pieces the built-in environments share: word lists, splits, numeric answers, sequence similarity."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prime_lab.envs.parsers import Parser, last_assistant_text

T = TypeVar("T")

WORDS = (
    "apple river stone cloud light paper green table music garden window silver orange planet forest bridge "
    "candle winter summer morning dragon pencil rocket button coffee yellow circle market island castle "
    "thunder breeze honey violet shadow mirror pocket rabbit turtle falcon meadow harbor lantern velvet "
    "marble copper saddle canyon desert valley glacier meteor comet signal engine ribbon tunnel basket "
    "ladder puzzle spirit anchor beacon cotton feather jungle kettle lemon mango nectar oyster pepper "
    "quartz raven salmon tiger umbrella walnut zebra almond bamboo cactus dolphin ember fossil granite "
    "hammer igloo jigsaw koala lizard magnet noodle orbit parrot quiver radish sponge tomato unicorn "
    "vapor wagon yogurt blanket crystal diamond eagle fabric gravel helmet insect jacket kitten "
    "lobster muffin napkin olive pillow quilt rocket spoon trumpet vessel whistle"
).split()

NAMES = (
    "Ada Alan Alice Amir Anna Arjun Ben Bianca Carlos Chen Chloe Dana David Diego Elena Emil Eva Farah Felix "
    "Grace Hana Hugo Ivan Iris Jack Jana Jonas Kai Kara Lars Leila Liam Lina Luca Maya Mei Milo Nadia Noah "
    "Nora Olga Omar Oscar Paula Priya Quinn Rafael Rosa Ruth Sami Sara Sofia Tariq Theo Uma Vera Victor "
    "Wen Xavier Yara Yusuf Zane Zoe"
).split()

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def generate_splits(make: Callable[[random.Random, int], T], *, seed: int, num_train: int, num_eval: int,
                    key: Callable[[T], Any] = repr) -> tuple[list[T], list[T]]:
    """Generate distinct items and cut them into disjoint train and eval splits (deterministic by seed)."""
    rng = random.Random(seed)
    seen: set[Any] = set()
    items: list[T] = []
    attempts = 0
    while len(items) < num_train + num_eval and attempts < 50 * (num_train + num_eval):
        attempts += 1
        item = make(rng, len(items))
        k = key(item)
        if k not in seen:
            seen.add(k)
            items.append(item)
    return items[:num_train], items[num_train:]


def limit(rows: list[T], max_examples: int) -> list[T]:
    return rows if max_examples is None or max_examples < 0 else rows[:max_examples]


def pick_split(split: str, train: list[T], test: list[T]) -> list[T]:
    if split not in ("train", "test", "eval"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return train if split == "train" else test


def parse_number(text: str | None) -> float | None:
    """The last number in `text` (commas allowed), or None."""
    if not text:
        return None
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def numbers_equal(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))


def lcs_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def lcs_ratio(a: Sequence[Any], b: Sequence[Any]) -> float:
    """2 * LCS / (len a + len b): 1.0 for equal sequences, 0.0 for nothing in common."""
    if not a and not b:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))


def correct_answer(completion: Any, answer: str, parser: Parser) -> float:
    """1.0 when the final number equals the answer: the parser's answer (e.g. an <answer> tag), or, when the reply
    has no such answer, the last number anywhere in the reply."""
    text = parser.parse_answer(completion)
    if text is None:
        text = last_assistant_text(completion)
    return 1.0 if numbers_equal(parse_number(text), float(answer)) else 0.0
