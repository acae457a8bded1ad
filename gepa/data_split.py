"""Train, validation and held-out test rows for GEPA from an environment, disjoint by prompt."""

from __future__ import annotations

import json
from typing import Any

from prime_lab.envs import Environment


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row["prompt"], sort_keys=True, default=str)


def train_val_test(env: Environment, num_train: int, num_val: int, num_test: int,
                   seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Training rows from the environment's dataset; validation and then test rows from its eval dataset (or
    from what is left of the dataset when it has none), never repeating a training prompt."""
    train = env.get_dataset(-1, seed=seed)[:num_train]
    seen = {_key(r) for r in train}
    rest = [r for r in env.get_eval_dataset(-1, seed=seed + 1) if _key(r) not in seen]
    val = rest[:num_val]
    test = rest[num_val:num_val + num_test]
    return train, val, test
