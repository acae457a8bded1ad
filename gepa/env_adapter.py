"""GEPA over an environment: each candidate's `system_prompt` replaces the rows' system message, the
environment's rollouts run concurrently against an OpenAI-compatible endpoint, and the rubric's reward is the score.

The engine calls this adapter from several threads at once (parallel proposals). Every call runs on one event loop
in a background thread, so all requests share one pair of clients and one limit of `max_concurrent` rollouts in
flight, and `close()` cancels what is still in flight (a stopped run does not wait for its requests to finish).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from prime_lab.envs import Environment, Rollout, SamplingArgs, replace_system_prompt
from prime_lab.envs.environment import DEFAULT_ROLLOUT_TIMEOUT_S
from prime_lab.envs.tool_prompt import ToolPlan
from prime_lab.gepa.adapter import Candidate, EvaluationBatch, ReflectiveDataset
from prime_lab.gepa.reflection import parse_proposal, reflection_prompt

SYSTEM_PROMPT = "system_prompt"


class AdapterClosed(RuntimeError):
    """An evaluation or reflection asked for after the run stopped."""


@dataclass
class Endpoint:
    """An OpenAI-compatible model: where it is and the name it serves."""

    base_url: str
    model: str
    api_key: str = "EMPTY"
    timeout: float = 600.0


def _text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages or [])


@dataclass
class EnvironmentAdapter:
    env: Environment
    task_model: Endpoint
    reflection_model: Endpoint
    sampling: SamplingArgs = field(default_factory=SamplingArgs)
    max_concurrent: int = 32
    state_columns: list[str] = field(default_factory=list)
    reflection_max_tokens: int = 1024
    reflection_temperature: float | None = None  # None: the endpoint's default
    on_rollout: Any = None  # optional callable(Rollout) -> None, e.g. for a progress display
    rollout_timeout: float | None = DEFAULT_ROLLOUT_TIMEOUT_S  # one rollout's limit (the environment's own if smaller)
    tools: ToolPlan | None = None  # the environment's tools where the task model's template drops them (runner.py)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gepa-adapter-loop", daemon=True)
        self._thread.start()
        self._closed = False
        self._task_client: Any = None
        self._reflection_client: Any = None
        self._gate: asyncio.Semaphore | None = None

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the adapter's loop and wait for it (from any thread but the loop's); a call that races
        `close()` fails instead of waiting on a loop that has stopped."""
        if self._closed:
            coro.close()
            raise AdapterClosed("the GEPA adapter is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if self._closed and not self._loop.is_running():
                    future.cancel()
                    raise AdapterClosed("the GEPA adapter is closed") from None

    def close(self) -> None:
        """Cancel the requests in flight, close the clients, stop the loop. Idempotent."""
        if self._closed:
            return
        self._closed = True

        async def shut_down() -> None:
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for client in (self._task_client, self._reflection_client):
                if client is not None:
                    await client.close()

        try:
            asyncio.run_coroutine_threadsafe(shut_down(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self._loop.close()

    def _client(self, endpoint: Endpoint) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "EMPTY", max_retries=1,
                           timeout=endpoint.timeout)

    # Adapter interface --------------------------------------------------------------------------------------
    def evaluate(self, batch: Sequence[dict[str, Any]], candidate: Candidate,
                 capture_traces: bool) -> EvaluationBatch:
        rows = [replace_system_prompt(r, candidate[SYSTEM_PROMPT]) for r in batch]
        if self.tools is not None:  # the tools' schemas after the candidate's text, not part of what GEPA rewrites
            rows = self.tools.rows(rows)
        rollouts = self._run(self._rollouts(rows))
        return EvaluationBatch(scores=[r.reward for r in rollouts], outputs=rollouts,
                               trajectories=[self._trace(r) for r in rollouts] if capture_traces else None)

    async def _rollouts(self, rows: list[dict[str, Any]]) -> list[Rollout]:
        """The rows' rollouts, at most `max_concurrent` in flight across every evaluation running at once."""
        if self._task_client is None:
            self._task_client = self._client(self.task_model)
        if self._gate is None:
            self._gate = asyncio.Semaphore(max(1, self.max_concurrent))
        gate, client = self._gate, self._task_client

        async def one(row: dict[str, Any]) -> Rollout:
            async with gate:
                done = await self.env.run_rollouts(client, self.task_model.model, [row], self.sampling,
                                                   max_concurrent=1, on_rollout=self.on_rollout,
                                                   timeout=self.rollout_timeout)
            return done[0]

        return list(await asyncio.gather(*(one(row) for row in rows)))

    def _trace(self, rollout: Rollout) -> dict[str, Any]:
        inputs = [m for m in rollout.prompt if m.get("role") != "system"]
        record: dict[str, Any] = {"Inputs": _text(inputs), "Generated Outputs": _text(rollout.completion),
                                  "Reward": round(rollout.reward, 4)}
        if rollout.answer not in ("", None):
            record["Expected answer"] = rollout.answer
        if rollout.metrics and len(rollout.metrics) > 1:
            record["Reward parts"] = {k: round(v, 4) for k, v in rollout.metrics.items()}
        if rollout.error:
            record["Error"] = rollout.error.splitlines()[-1][:500]
        for column in self.state_columns:
            if column in rollout.state:
                value = rollout.state[column]
                record[column] = value if isinstance(value, str) else json.dumps(value, default=str)
        return record

    def make_reflective_dataset(self, candidate: Candidate, evaluation: EvaluationBatch,
                                components: Sequence[str]) -> ReflectiveDataset:
        records = list(evaluation.trajectories or [])
        return {name: records for name in components}

    def propose_new_texts(self, candidate: Candidate, dataset: ReflectiveDataset,
                          components: Sequence[str]) -> dict[str, str]:
        return {name: self._run(self._propose(name, candidate[name], dataset[name])) for name in components}

    async def _propose(self, component: str, current: str, records: list[dict[str, Any]]) -> str:
        if self._reflection_client is None:
            self._reflection_client = self._client(self.reflection_model)
        extra = {} if self.reflection_temperature is None else {"temperature": self.reflection_temperature}
        response = await self._reflection_client.chat.completions.create(
            model=self.reflection_model.model, max_tokens=self.reflection_max_tokens,
            messages=[{"role": "user", "content": reflection_prompt(component, current, records)}], **extra)
        reply = response.choices[0].message.content if response.choices else ""
        return parse_proposal(reply or "", current)
