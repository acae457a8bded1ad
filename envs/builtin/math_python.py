"""math-python: arithmetic with a Python tool that runs in a sandbox (as verifiers' math_python), and a calculator.

The model may call `python(code)`, as often as it likes within `max_turns`: the code runs as a script in a local
sandbox of the rollout's own (created at its first call, deleted when the rollout ends; files it writes stay there
between calls), each call cut after `python_timeout` seconds, and what it printed comes back (stdout, stderr, a
non-zero exit code; each cut at `max_output_chars` characters). `calculate(expression)` is a safe evaluator of
+ - * / // % ** and parentheses, for models that call a plain tool better than they write Python. The final number
goes in <answer> tags. Reward: 1.0 for the right number.
"""

from __future__ import annotations

import ast
import operator
import random
from typing import Any

from prime_lab.envs import Rubric, State, ThinkParser, ToolEnv, XMLParser
from prime_lab.envs.builtin._common import correct_answer, generate_splits, limit, pick_split
from prime_lab.envs.builtin._sandbox import close_sandbox, open_sandbox, run_python, tool_output
from prime_lab.envs.parsers import Messages
from prime_lab.envs.tools import parse_tool_calls

SYSTEM_PROMPT = ("Compute the answer to the arithmetic question. Use the python tool to run Python code that "
                 "prints the result (or the calculate tool for a plain expression), then give the final number "
                 "inside <answer> tags.")
NAME = "math-python"
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


class MathPythonEnv(ToolEnv):
    """A ToolEnv whose `python` tool runs in the rollout's sandbox (`_sandbox.py`)."""

    def __init__(self, python_timeout: float, max_output_chars: int, **kwargs: Any) -> None:
        self.python_timeout = python_timeout
        self.max_output_chars = max_output_chars
        super().__init__(tools=[self.python, calculate], **kwargs)

    async def python(self, code: str, *, state: State) -> str:
        """Run Python code (a script) in a sandbox and return what it prints: stdout, stderr and a non-zero exit code.

        Files it writes stay for later calls in the same conversation; print() what you want to see."""
        calls = state["python_calls"] = state.get("python_calls", 0) + 1
        result = await run_python(await open_sandbox(state, NAME), code, f"cell_{calls}.py", self.python_timeout)
        return tool_output(result, self.max_output_chars, self.python_timeout)

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        if any(name == "python" for name, _, _ in parse_tool_calls(messages[-1])):
            await open_sandbox(state, NAME)  # one that cannot be made fails the rollout (not the model's doing)
        return await super().env_response(messages, state)

    async def cleanup_state(self, state: State) -> None:
        await close_sandbox(state)


def load_environment(
    max_turns: int = 5,
    difficulty: str = "medium",
    split: str = "train",
    max_examples: int = -1,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
    python_timeout: float = 10.0,
    max_output_chars: int = 2000,
) -> ToolEnv:
    terms = {"easy": 2, "medium": 3, "hard": 4}.get(difficulty)
    if terms is None:
        raise ValueError(f"difficulty must be easy, medium or hard (not {difficulty!r})")
    train, test = generate_splits(lambda rng, _: make_question(rng, terms), seed=seed,
                                  num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"])
    parser = ThinkParser(XMLParser(["answer"]))

    if not python_timeout > 0 or max_output_chars < 1:
        raise ValueError("python_timeout must be above 0 and max_output_chars at least 1")
    return MathPythonEnv(python_timeout=python_timeout, max_output_chars=max_output_chars,
                         dataset=limit(pick_split(split, train, test), max_examples),
                         eval_dataset=limit(test, max_examples), system_prompt=system_prompt, parser=parser,
                         max_turns=max_turns, rubric=Rubric([correct_answer], parser=parser))
