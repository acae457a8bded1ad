"""gsm8k: grade-school arithmetic word problems with numeric answers, generated in code (GSM8K-style).

`difficulty` sets how many steps a problem takes (easy 1, medium 2, hard 3, or mixed); `split` picks the
training rows (`train`) or the held-out ones (`test`); evaluation always uses the held-out rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from prime_lab.envs import Rubric, SingleTurnEnv, ThinkParser, XMLParser
from prime_lab.envs.builtin._common import NAMES, correct_answer, generate_splits, limit, pick_split

SYSTEM_PROMPT = ("Solve the math problem. Think step by step, then give the final number inside "
                 "<answer> tags, e.g. <answer>42</answer>.")
ITEMS = ["apples", "marbles", "stickers", "books", "cookies", "pencils", "coins", "cards"]
STEPS = {"easy": 1, "medium": 2, "hard": 3}

Step = Callable[[random.Random, int, str], tuple[str, int]]


def _add(rng: random.Random, total: int, item: str) -> tuple[str, int]:
    k = rng.randint(2, 30)
    return f"Then they get {k} more {item}.", total + k


def _sub(rng: random.Random, total: int, item: str) -> tuple[str, int]:
    k = rng.randint(1, max(1, total - 1))
    return f"Then they give away {k} {item}.", total - k


def _mul(rng: random.Random, total: int, item: str) -> tuple[str, int]:
    k = rng.randint(2, 4)
    return f"Then the number of {item} they have is multiplied by {k}.", total * k


def _div(rng: random.Random, total: int, item: str) -> tuple[str, int]:
    divisors = [d for d in (2, 3, 4, 5) if total % d == 0]
    if not divisors:
        return _add(rng, total, item)
    d = rng.choice(divisors)
    return f"Then they split their {item} into {d} equal piles and keep one pile.", total // d


OPERATIONS: list[Step] = [_add, _sub, _mul, _div]


def make_problem(rng: random.Random, steps: int) -> dict[str, Any]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(3, 40)
    sentences = [f"{name} has {total} {item}."]
    for _ in range(steps):
        sentence, total = rng.choice(OPERATIONS)(rng, total, item)
        sentences.append(sentence)
    sentences.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(sentences), "answer": str(total), "info": {"steps": steps}}


def load_environment(
    difficulty: str = "medium",
    split: str = "train",
    max_examples: int = -1,
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> SingleTurnEnv:
    if difficulty not in (*STEPS, "mixed"):
        raise ValueError(f"difficulty must be one of easy, medium, hard, mixed (not {difficulty!r})")

    def make(rng: random.Random, _: int) -> dict[str, Any]:
        steps = STEPS[difficulty] if difficulty != "mixed" else rng.randint(1, 3)
        return make_problem(rng, steps)

    train, test = generate_splits(make, seed=seed, num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"])
    parser = ThinkParser(XMLParser(["answer"]))

    return SingleTurnEnv(dataset=limit(pick_split(split, train, test), max_examples),
                         eval_dataset=limit(test, max_examples), system_prompt=system_prompt, parser=parser,
                         rubric=Rubric([correct_answer], parser=parser))
