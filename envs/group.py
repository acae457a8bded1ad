"""`EnvGroup`: several environments as one, for multi-environment runs; rows carry their environment's task. A row's
rollout is its environment's, scored by its rubric within its time limit (the environment's own where smaller)."""

from __future__ import annotations

from typing import Any

from prime_lab.envs.environment import (
    DEFAULT_ROLLOUT_TIMEOUT_S,
    Environment,
    Rollout,
    SamplingArgs,
    rollout_time_limit,
    sample_rows,
)


class EnvGroup(Environment):
    def __init__(self, envs: list[Environment], names: list[str] | None = None) -> None:
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        self.names = names or [e.task for e in envs]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"environment names must be unique: {self.names}")
        self.envs = dict(zip(self.names, envs, strict=True))
        self.env_id = "+".join(self.names)
        self.system_prompt = None
        self.rubric = envs[0].rubric
        self.parser = envs[0].parser

    def env_for(self, task: str) -> Environment:
        return self.envs[task]

    def _tagged(self, rows_by_env: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name, rows in rows_by_env.items():
            out += [{**row, "task": name, "example_id": f"{name}/{row['example_id']}"} for row in rows]
        return out

    def get_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        return sample_rows(self._tagged({k: e.get_dataset() for k, e in self.envs.items()}), n, seed)

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        return sample_rows(self._tagged({k: e.get_eval_dataset() for k, e in self.envs.items()}), n, seed)

    def time_limit(self, row: dict[str, Any], configured: float | None = DEFAULT_ROLLOUT_TIMEOUT_S) -> float | None:
        return rollout_time_limit(self.env_for(row["task"]), configured)

    async def rollout(self, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs) -> Rollout:
        return await self.env_for(row["task"]).rollout(client, model, row, sampling)

    async def score(self, rollout: Rollout) -> None:
        await self.env_for(rollout.task).score(rollout)
