"""A rubric: weighted reward functions, each called with the keyword arguments it declares.

Reward functions take any of `prompt, completion, answer, state, info, task, parser` (and `**kwargs` to get all);
they may be sync or async. One that raises scores 0.0 and its error is recorded on the rollout; it never ends a run.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prime_lab.envs.parsers import Parser

RewardFunc = Callable[..., Any]
INJECTABLE = ("prompt", "completion", "answer", "state", "info", "task", "parser")


@dataclass
class Score:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def call_with_declared_kwargs(func: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Call `func` with the subset of `available` it declares (all of it if it takes **kwargs)."""
    params = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return func(**available)
    return func(**{k: v for k, v in available.items() if k in params})


class Rubric:
    def __init__(self, funcs: list[RewardFunc] | None = None, weights: list[float] | None = None,
                 parser: Parser | None = None) -> None:
        self.funcs: list[RewardFunc] = list(funcs or [])
        self.weights: list[float] = list(weights) if weights is not None else [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"Rubric has {len(self.funcs)} reward functions but {len(self.weights)} weights")
        self.parser = parser or Parser()

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.funcs.append(func)
        self.weights.append(weight)

    async def score(self, *, prompt: Any, completion: Any, answer: Any, state: dict[str, Any],
                    info: dict[str, Any], task: str) -> Score:
        available = {"prompt": prompt, "completion": completion, "answer": answer, "state": state, "info": info,
                     "task": task, "parser": self.parser}
        metrics: dict[str, float] = {}
        errors: list[str] = []
        total = 0.0
        for func, weight in zip(self.funcs, self.weights, strict=True):
            name = getattr(func, "__name__", "reward")
            try:
                value = call_with_declared_kwargs(func, available)
                if inspect.isawaitable(value):
                    value = await value
                value = float(value)
            except Exception as exc:  # a broken reward function scores 0 and is reported, never fatal
                errors.append(f"reward function {name} raised {type(exc).__name__}: {exc}\n"
                              + "".join(traceback.format_exception(exc)[-3:]))
                value = 0.0
            metrics[name] = value
            total += weight * value
        return Score(reward=total, metrics=metrics, errors=errors)

    def score_sync(self, **kwargs: Any) -> Score:
        return asyncio.run(self.score(**kwargs))
