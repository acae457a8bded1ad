"""math-python: arithmetic with a calculator tool (a tool-use environment in the spirit of math-python).

The model may call `calculate(expression)` (a safe evaluator of + - * / // % ** and parentheses) as often as it
likes within `max_turns`, then gives the final number in <answer> tags. Reward: 1.0 for the right number.
"""

from __future__ import annotations

import ast
import operator
import random
from typing import Any

from prime_lab.envs import Rubric, ThinkParser, ToolEnv, XMLParser
from prime_lab.envs.builtin._common import correct_answer, generate_splits, limit, pick_split

SYSTEM_PROMPT = ("Compute the answer to the arithmetic question. Use the calculate tool for the arithmetic, then "
                 "give the final number inside <answer> tags.")
_OPS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                         ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
                         ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses) and return the result."""
    value = _eval(ast.parse(expression, mode="eval"))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def make_question(rng: random.Random, terms: int) -> dict[str, Any]:
    numbers = [rng.randint(12, 999) for _ in range(terms)]
    ops = [rng.choice(["+", "-", "*"]) for _ in range(terms - 1)]
    expression = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(ops, numbers[1:], strict=True))
    return {"question": f"What is {expression}?", "answer": calculate(expression)}


def load_environment(
    max_turns: int = 5,
    difficulty: str = "medium",
    split: str = "train",
    max_examples: int = -1,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> ToolEnv:
    terms = {"easy": 2, "medium": 3, "hard": 4}.get(difficulty)
    if terms is None:
        raise ValueError(f"difficulty must be easy, medium or hard (not {difficulty!r})")
    train, test = generate_splits(lambda rng, _: make_question(rng, terms), seed=seed,
                                  num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"])
    parser = ThinkParser(XMLParser(["answer"]))

    return ToolEnv(tools=[calculate], dataset=limit(pick_split(split, train, test), max_examples),
                   eval_dataset=limit(test, max_examples), system_prompt=system_prompt, parser=parser,
                   max_turns=max_turns, rubric=Rubric([correct_answer], parser=parser))
