"""Which rollout groups go into a batch: environment sampling by ratio, and difficulty filtering.

Two spellings of difficulty filtering, as the config allows one of them:
- Hosted's `[buffer]`: a group whose mean reward is above `easy_threshold` is *easy*, below `hard_threshold` *hard*;
  with `online_difficulty_filtering` on, an easy group is kept with probability `easy_fraction` and a hard one with
  `hard_fraction` (0 = drop them all).
- prime-rl's `[difficulty_filter]`: drop a group whose reward variance is below `min_reward_variance`, or whose mean
  is above `max_reward` or below `min_reward`.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prime_lab.trainer.config import BufferConfig, DifficultyFilterConfig


@dataclass
class GroupVerdict:
    keep: bool
    difficulty: str  # "easy" | "hard" | "normal"
    reason: str = ""


def _stats(rewards: list[float]) -> tuple[float, float]:
    mean = sum(rewards) / len(rewards)
    return mean, sum((r - mean) ** 2 for r in rewards) / len(rewards)


@dataclass
class GroupFilter:
    buffer: BufferConfig
    difficulty_filter: DifficultyFilterConfig
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def judge(self, rewards: list[float]) -> GroupVerdict:
        mean, variance = _stats(rewards)
        difficulty = "easy" if mean > self.buffer.easy_threshold else \
            "hard" if mean < self.buffer.hard_threshold else "normal"
        f = self.difficulty_filter
        if f.enabled:
            if variance < f.min_reward_variance:
                return GroupVerdict(False, difficulty, f"reward variance {variance:.3g} < min_reward_variance "
                                                       f"{f.min_reward_variance:g}")
            if mean > f.max_reward:
                return GroupVerdict(False, difficulty, f"mean reward {mean:.3g} > max_reward {f.max_reward:g}")
            if mean < f.min_reward:
                return GroupVerdict(False, difficulty, f"mean reward {mean:.3g} < min_reward {f.min_reward:g}")
        if self.buffer.online_difficulty_filtering and difficulty != "normal":
            keep_share = self.buffer.easy_fraction if difficulty == "easy" else self.buffer.hard_fraction
            if self.rng.random() >= keep_share:
                threshold = "easy_threshold" if difficulty == "easy" else "hard_threshold"
                return GroupVerdict(False, difficulty, f"{difficulty} group (mean reward {mean:.3g} past "
                                                       f"{threshold}), kept share {keep_share:g}")
        return GroupVerdict(True, difficulty)


class ExampleSampler:
    """Examples for new groups: an environment by weight, then that environment's rows in a shuffled order,
    reshuffled each pass (epoch). Deterministic for a seed."""

    def __init__(self, rows_by_env: dict[str, list[dict[str, Any]]], weights: list[float], seed: int = 42) -> None:
        self.names = list(rows_by_env)
        self.rows = rows_by_env
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.rng = random.Random(seed)
        self._orders: dict[str, list[int]] = {}
        self._positions: dict[str, int] = dict.fromkeys(self.names, 0)
        empty = [n for n in self.names if not rows_by_env[n]]
        if empty:
            raise ValueError(f"environment {empty[0]} has no training examples")

    def next(self) -> tuple[str, dict[str, Any]]:
        name = self.rng.choices(self.names, weights=self.weights)[0] if len(self.names) > 1 else self.names[0]
        return name, self.row_of(name)

    def row_of(self, name: str) -> dict[str, Any]:
        """The next row of environment `name` in its shuffled order, reshuffled after each pass."""
        rows = self.rows[name]
        order = self._orders.get(name)
        if order is None or self._positions[name] >= len(order):
            order = self._orders[name] = self.rng.sample(range(len(rows)), len(rows))
            self._positions[name] = 0
        row = rows[order[self._positions[name]]]
        self._positions[name] += 1
        return row


class MixSampler(ExampleSampler):
    """`ExampleSampler`'s draws, holding the environment mix when groups fail: a failed group's environment is owed
    one group (`owe`), and the next draw serves it before drawing by weight, with that environment's next row (its
    own shuffled order, as `next` takes them). A replacement that fails too is not owed again: an environment that
    fails every rollout gets twice its share of groups, never all of them, and its failures count against it
    (the orchestrator's `ENV_ERRORED_LIMIT`) rather than stalling the batch. With a share p of its groups failing, an
    environment keeps all but p² of its share (0.25% at the 5% that raises the `env_errored` alert). Deterministic
    for a seed and the same failures."""

    def __init__(self, rows_by_env: dict[str, list[dict[str, Any]]], weights: list[float], seed: int = 42) -> None:
        super().__init__(rows_by_env, weights, seed=seed)
        self.owed: deque[str] = deque()

    def owe(self, name: str) -> None:
        self.owed.append(name)

    def draw(self) -> tuple[str, dict[str, Any], bool]:
        """(environment, row, whether the group replaces a failed one) for the next group."""
        if self.owed:
            name = self.owed.popleft()
            return name, self.row_of(name), True
        name, row = self.next()
        return name, row, False
