"""Environments: a dataset, a rollout through an OpenAI-compatible client, a rubric (verifiers' classic API).

`MultiTurnEnv` is the general loop (model turn, environment response, until done or `max_turns`);
`SingleTurnEnv` is one model turn. Each rollout keeps what RL needs: per-turn prompt and completion token ids and
the sampler's logprobs (when the endpoint returns them, as vLLM and our built-in server do), truncation, the stop
condition, timing and token usage. Failures (the endpoint, `env_response`, a reward function, an exception a custom
`rollout` or `score` raises) are recorded on the rollout; they never end a whole evaluation or run (an isolated
environment's server down for good, `EnvironmentDown`, does).

Every rollout has a time limit (`rollout_time_limit`: a run's `[[env]] timeout`, `DEFAULT_ROLLOUT_TIMEOUT_S`
elsewhere, or the environment's own `timeout_seconds` where smaller), over the rollout and its scoring together; one
past it fails, timed out (`timed_rollout`).
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from prime_lab.envs.env_server import EnvironmentDown
from prime_lab.envs.parsers import Messages, Parser
from prime_lab.envs.rubric import Rubric

T = TypeVar("T")

State = dict[str, Any]

DEFAULT_ROLLOUT_TIMEOUT_S = 300.0  # a rollout's time limit unless a run's `[[env]] timeout` says otherwise
TIMED_OUT = "rollout timed out after"  # how a timed-out rollout's error begins (`timed_out`)
# `Rollout.error_source`: the model endpoint (a request failed, or its answer could not be read), the environment
# (its own code or server raised), a reward function (the rubric's scoring)
ERROR_SOURCES = ("model", "environment", "scorer")


@dataclass
class SamplingArgs:
    """Per-request sampling settings; `rl_fields` asks for token ids and logprobs (vLLM's spelling)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    rl_fields: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SamplingArgs:
        """Sampling settings as a user gives them (`-S`, a config's `[sampling]`): the fields above by name
        (max_tokens, temperature, top_p, stop, seed), everything else sent to the endpoint as `extra_body`."""
        known = {"max_tokens", "temperature", "top_p", "stop", "seed"}
        return cls(**{k: v for k, v in settings.items() if k in known},
                   extra_body={k: v for k, v in settings.items() if k not in known})

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                                  "top_p": self.top_p}
        if self.stop:
            kwargs["stop"] = self.stop
        if self.seed is not None:
            kwargs["seed"] = self.seed
        extra = dict(self.extra_body)
        if self.rl_fields:
            kwargs["logprobs"] = True
            extra["return_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        return kwargs


@dataclass
class Turn:
    """One model call inside a rollout."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    finish_reason: str | None = None
    prompt_messages: int = 0  # how many messages the model saw for this turn
    generation_ms: float = 0.0


@dataclass
class Rollout:
    example_id: Any
    task: str
    prompt: Messages
    completion: Messages = field(default_factory=list)
    answer: Any = ""
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    is_truncated: bool = False
    stop_condition: str = ""
    error: str | None = None
    timing: dict[str, float] = field(default_factory=dict)
    token_usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    state: State = field(default_factory=dict)
    # the side `error` came from first (ERROR_SOURCES); None where it does not say (a time limit: `timed_out`)
    error_source: str | None = None

    def result_row(self) -> dict[str, Any]:
        """One row of results.jsonl (the fields verifiers writes, plus ours)."""
        return {"example_id": self.example_id, "task": self.task, "prompt": self.prompt,
                "completion": self.completion, "answer": self.answer, "info": self.info, "reward": self.reward,
                "metrics": self.metrics, "timing": self.timing, "is_truncated": self.is_truncated,
                "stop_condition": self.stop_condition, "error": self.error, "error_source": self.error_source,
                "token_usage": self.token_usage, "turns": [asdict(t) for t in self.turns]}


def normalize_rows(rows: Iterable[dict[str, Any]], system_prompt: str | None, task: str,
                   few_shot: Messages | None = None) -> list[dict[str, Any]]:
    """Rows with `prompt` (chat messages) or `question` become rows with `prompt`, `answer`, `info`, `task`,
    `example_id` (verifiers' dataset format).

    `system_prompt` opens every prompt, as in verifiers from 0.1.9: a `question` row gets it (then `few_shot`, then
    the question); a `prompt` row without a system message gets it prepended; a `prompt` row that already opens with
    a system message keeps its own (the row's author chose it), and `few_shot` does not apply to `prompt` rows.
    """
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if "prompt" in row:
            prompt = [dict(m) for m in row["prompt"]]
            if system_prompt and not (prompt and prompt[0].get("role") == "system"):
                prompt.insert(0, {"role": "system", "content": system_prompt})
        elif "question" in row:
            prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) \
                + [dict(m) for m in (few_shot or [])] + [{"role": "user", "content": str(row["question"])}]
        else:
            raise ValueError(f"dataset row {index} has neither 'prompt' nor 'question'")
        out.append({"example_id": row.get("example_id", index), "prompt": prompt, "answer": row.get("answer", ""),
                    "info": dict(row.get("info") or {}), "task": row.get("task") or task})
    return out


def replace_system_prompt(row: dict[str, Any], system_prompt: str) -> dict[str, Any]:
    """The row with its system message replaced by (or, without one, preceded by) `system_prompt`: how GEPA tries a
    candidate prompt on any environment, and how an RL run (`[[env]] system_prompt`) or an evaluation
    (`--system-prompt-file`) starts from one."""
    prompt = [dict(m) for m in row["prompt"]]
    if prompt and prompt[0].get("role") == "system":
        prompt[0]["content"] = system_prompt
    elif system_prompt:
        prompt.insert(0, {"role": "system", "content": system_prompt})
    return {**row, "prompt": prompt}


def sample_rows(rows: list[dict[str, Any]], n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
    """`n` rows (all for -1), shuffled by `seed` when one is given."""
    chosen = list(rows)
    if seed is not None:
        random.Random(seed).shuffle(chosen)
    return chosen if n is None or n < 0 else chosen[:n]


class Environment:
    """Base: holds the data, the parser and the rubric; subclasses define the rollout."""

    # The environment's own limit on one rollout, in seconds (None: none); verifiers' `MultiTurnEnv` has the same
    # attribute. Where it is smaller than the run's `[[env]] timeout`, it is the limit (`rollout_time_limit`).
    timeout_seconds: float | None = None
    # How the loader pointed it at the run's LLM judge (judges.Wiring.describe), for the run's log; None: no judge.
    judge_wiring: str | None = None

    def __init__(
        self,
        dataset: Iterable[dict[str, Any]] | None = None,
        eval_dataset: Iterable[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        few_shot: Messages | None = None,
        sampling_args: dict[str, Any] | None = None,
        env_id: str = "",
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise TypeError(f"unexpected environment settings: {', '.join(sorted(kwargs))}")
        self.env_id = env_id
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self.parser = parser or (rubric.parser if rubric else Parser())
        self.rubric = rubric or Rubric(parser=self.parser)
        self.sampling_args = dict(sampling_args or {})
        self._train_raw = list(dataset) if dataset is not None else []
        self._eval_raw = list(eval_dataset) if eval_dataset is not None else None
        if not self._train_raw and not self._eval_raw:
            raise ValueError("an environment needs a dataset or an eval_dataset")

    @property
    def task(self) -> str:
        return self.env_id.split("/")[-1] if self.env_id else type(self).__name__

    def with_system_prompt(self, system_prompt: str | None) -> Environment:
        """The same environment with another system prompt (GEPA's candidates go through here)."""
        self.system_prompt = system_prompt
        return self

    def _rows(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return normalize_rows(raw, self.system_prompt, self.task, self.few_shot)

    def get_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        return sample_rows(self._rows(self._train_raw or self._eval_raw or []), n, seed)

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        raw = self._eval_raw if self._eval_raw is not None else self._train_raw
        return sample_rows(self._rows(raw), n, seed)

    async def rollout(self, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs) -> Rollout:
        raise NotImplementedError

    def time_limit(self, row: dict[str, Any], configured: float | None = DEFAULT_ROLLOUT_TIMEOUT_S) -> float | None:
        """The time limit of `row`'s rollout and its scoring: `rollout_time_limit` (`EnvGroup`: its member's)."""
        return rollout_time_limit(self, configured)

    async def score(self, rollout: Rollout) -> None:
        start = time.perf_counter()
        score = await self.rubric.score(prompt=rollout.prompt, completion=rollout.completion, answer=rollout.answer,
                                        state=rollout.state, info=rollout.info, task=rollout.task)
        rollout.reward, rollout.metrics = score.reward, score.metrics
        if score.errors:
            rollout.error = "\n".join(([rollout.error] if rollout.error else []) + score.errors)
            rollout.error_source = rollout.error_source or "scorer"
        rollout.timing["scoring_ms"] = (time.perf_counter() - start) * 1000

    async def run_rollouts(
        self,
        client: Any,
        model: str,
        rows: Sequence[dict[str, Any]],
        sampling: SamplingArgs,
        *,
        rollouts_per_example: int = 1,
        max_concurrent: int = 32,
        on_rollout: Callable[[Rollout], Awaitable[None] | None] | None = None,
        timeout: float | None = DEFAULT_ROLLOUT_TIMEOUT_S,
    ) -> list[Rollout]:
        """Every row `rollouts_per_example` times, at most `max_concurrent` at once, scored; results in order. Each
        rollout and its scoring have `self.time_limit(row, timeout)` together, from when the rollout starts (not
        while it waits for its turn)."""
        gate = asyncio.Semaphore(max(1, max_concurrent))
        jobs = [row for row in rows for _ in range(rollouts_per_example)]

        async def one(row: dict[str, Any]) -> Rollout:
            async with gate:
                rollout = await timed_rollout(self, client, model, row, sampling, self.time_limit(row, timeout))
            if on_rollout is not None:
                maybe = on_rollout(rollout)
                if asyncio.iscoroutine(maybe):
                    await maybe
            return rollout

        return list(await asyncio.gather(*(one(row) for row in jobs)))


def _limit(value: Any) -> float | None:
    """A time limit as a number of seconds > 0, else None (no limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def rollout_time_limit(env: Environment, configured: float | None = DEFAULT_ROLLOUT_TIMEOUT_S) -> float | None:
    """The time limit of one rollout of `env`, in seconds: `configured` (a run's `[[env]] timeout`), or the
    environment's own `timeout_seconds` where that is smaller (None: no limit at all). An in-process verifiers
    environment's own is its `timeout_seconds` (`VerifiersEnvironment`), an isolated one's as its interpreter
    described it."""
    limits = [limit for limit in (_limit(configured), _limit(getattr(env, "timeout_seconds", None)))
              if limit is not None]
    return min(limits) if limits else None


def failed_rollout(row: Mapping[str, Any], error: str, elapsed_ms: float, source: str | None = None) -> Rollout:
    """The failed rollout of a row whose rollout gave nothing back (it raised, or ran past its limit): its error,
    blamed on `source` (ERROR_SOURCES; None: it does not say), stop condition "error"."""
    return Rollout(example_id=row.get("example_id"), task=str(row.get("task", "")),
                   prompt=[dict(m) for m in row["prompt"]], answer=row.get("answer", ""),
                   info=dict(row.get("info") or {}), stop_condition="error", error=error, error_source=source,
                   timing={"total_ms": elapsed_ms})


def fail_scoring(rollout: Rollout, error: str, elapsed_ms: float) -> Rollout:
    """`rollout`, which came back and whose scoring failed: its reward 0, `error` first among its errors, blamed on
    the scorer."""
    rollout.error = error + (f"\n{rollout.error}" if rollout.error else "")
    rollout.reward, rollout.metrics, rollout.stop_condition, rollout.error_source = 0.0, {}, "error", "scorer"
    rollout.timing["total_ms"] = elapsed_ms
    return rollout


def timed_out_rollout(row: dict[str, Any], limit: float, elapsed_ms: float, rollout: Rollout | None = None) -> Rollout:
    """The failed rollout of a row whose rollout ran past `limit` seconds; with `rollout` (it came back, its scoring
    ran past the limit), that rollout, its reward 0 and its error this one."""
    error = (f"{TIMED_OUT} {limit:g} s{'' if rollout is None else ' while its reward functions ran'} (the "
             "per-rollout time limit, over the rollout and its scoring: a run's [[env]] timeout, or the environment's "
             "own timeout_seconds where smaller)")
    if rollout is None:
        return failed_rollout(row, error, elapsed_ms)
    return fail_scoring(rollout, error, elapsed_ms)


def error_text(exc: Exception) -> str:
    """An exception as a rollout's error: its type and message, and for one that is not the endpoint's (openai,
    httpx) the last lines of its traceback (where it was raised)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if _is_api_error(exc) else text + "\n" + "".join(traceback.format_exception(exc)[-3:])


def raised_rollout(row: Mapping[str, Any], exc: Exception, elapsed_ms: float) -> Rollout:
    """The failed rollout of a row whose rollout raised `exc` (an environment's own `rollout`, or a group's): blamed
    on the environment, or on the model where it is the endpoint's error (openai, httpx)."""
    return failed_rollout(row, error_text(exc), elapsed_ms, "model" if _is_api_error(exc) else "environment")


def may_fail(exc: Exception) -> bool:
    """Whether `exc`, raised by a rollout or its scoring, is that rollout's failure: any exception but an
    environment's server down for good (`EnvironmentDown`), which ends the evaluation or run."""
    return not isinstance(exc, EnvironmentDown)


def timed_out(rollout: Rollout) -> bool:
    """Whether `rollout` failed for running past its time limit (it also counts as errored)."""
    return bool(rollout.error and rollout.error.startswith(TIMED_OUT))


def empty(rollout: Rollout) -> bool:
    """Whether `rollout` came back without error but with nothing from the model: no text and no tool call in any
    assistant message (an end-of-sequence token alone is empty). prime-rl's guide watches these with the errored
    ones ("sustained > 5% is a smell")."""
    said = any(m.get("role") == "assistant" and (str(m.get("content") or "").strip() or m.get("tool_calls"))
               for m in rollout.completion if isinstance(m, dict))
    return not rollout.error and not said


async def timed_rollout(env: Environment, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs,
                        timeout: float | None, generated: Callable[[], None] | None = None) -> Rollout:
    """`env.rollout(...)` and `env.score(...)` of it, together cut after `timeout` seconds (None: no limit): a rollout
    or a scorer past it (a reward that awaits a judge forever) is cancelled and comes back failed
    (`timed_out_rollout`, stop condition "error"), so a hung rollout never holds its group. `generated` is called
    once the rollout is back, before it is scored. An exception of the rollout is a failed rollout blamed on the
    environment (`raised_rollout`), one of its scoring a failed rollout blamed on the scorer; `EnvironmentDown` (an
    isolated environment's server down for good) and cancellation go through.

    Only work that waits (on the endpoint, a tool, `asyncio.sleep`, an environment server) can be cut: code that
    blocks the event loop holds every other rollout of this process too, and cannot be interrupted from inside it (an
    isolated environment's server is another process: its requests are cut, and cancelled on the server).
    """
    done: list[Rollout] = []
    started = time.perf_counter()

    def elapsed_ms() -> float:
        return (time.perf_counter() - started) * 1000

    async def scored() -> Rollout:
        try:
            rollout = await env.rollout(client, model, row, sampling)
        except Exception as exc:
            if not may_fail(exc):
                raise
            return raised_rollout(row, exc, elapsed_ms())
        done.append(rollout)
        if generated is not None:
            generated()
        try:
            await env.score(rollout)
        except Exception as exc:
            if not may_fail(exc):
                raise
            return fail_scoring(rollout, error_text(exc), elapsed_ms())
        return rollout

    def cut(elapsed_ms: float) -> Rollout:
        return timed_out_rollout(row, timeout or 0.0, elapsed_ms, done[0] if done else None)

    return await cut_after(timeout, scored(), cut)


async def cut_after(limit: float | None, work: Awaitable[T], timed_out: Callable[[float], T]) -> T:
    """`work`'s result, or past `limit` seconds (None: no limit) `work` cancelled and `timed_out(elapsed ms)`'s;
    a TimeoutError of `work`'s own goes through."""
    if limit is None:
        return await work
    started = time.perf_counter()
    try:
        async with asyncio.timeout(limit) as deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise
        return timed_out((time.perf_counter() - started) * 1000)


def _turn_from_response(response: Any, prompt_messages: int, elapsed_ms: float) -> tuple[Turn, dict[str, Any]]:
    """The RL fields of a chat completion (vLLM's spelling) and the assistant message."""
    if not getattr(response, "choices", None):
        raise ValueError("the endpoint returned no choices")
    choice = response.choices[0]
    message = choice.message
    content = message.content if message is not None else None
    assistant: dict[str, Any] = {"role": "assistant", "content": content or ""}
    tool_calls = getattr(message, "tool_calls", None) if message is not None else None
    if tool_calls:
        assistant["tool_calls"] = [tc.model_dump() if hasattr(tc, "model_dump") else tc for tc in tool_calls]
    extra = getattr(response, "model_extra", None) or {}
    choice_extra = getattr(choice, "model_extra", None) or {}
    logprobs = None
    if getattr(choice, "logprobs", None) is not None and choice.logprobs.content is not None:
        logprobs = [float(t.logprob) for t in choice.logprobs.content]
    turn = Turn(prompt_token_ids=extra.get("prompt_token_ids"), completion_token_ids=choice_extra.get("token_ids"),
                completion_logprobs=logprobs, finish_reason=choice.finish_reason, prompt_messages=prompt_messages,
                generation_ms=elapsed_ms)
    return turn, assistant


class MultiTurnEnv(Environment):
    """Model turn, then `env_response`, until `is_completed` or `max_turns` model turns."""

    def __init__(self, max_turns: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns

    def setup_state(self, row: dict[str, Any]) -> State:
        return {"turn": 0, "answer": row["answer"], "info": row["info"], "task": row["task"]}

    async def cleanup_state(self, state: State) -> None:
        """Called once when a rollout ends, however it ends (completed, failed, cut at its time limit: then while
        it is being cancelled): give back what the rollout took (a sandbox its tools opened). It runs before the
        rollout is scored; an exception it raises is recorded on the rollout."""

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return False

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        raise NotImplementedError(f"{type(self).__name__} must define env_response")

    async def get_model_response(self, client: Any, model: str, messages: Messages, sampling: SamplingArgs,
                                 state: State) -> Any:
        """One chat completion for the conversation so far (`ToolEnv` adds its tools here)."""
        return await client.chat.completions.create(model=model, messages=messages, **sampling.request_kwargs())

    async def rollout(self, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs) -> Rollout:
        started = time.perf_counter()
        prompt = [dict(m) for m in row["prompt"]]
        rollout = Rollout(example_id=row["example_id"], task=row["task"], prompt=prompt, answer=row["answer"],
                          info=row["info"])
        state = rollout.state = self.setup_state(row)
        messages = list(prompt)
        generation_ms = 0.0
        source = "environment"  # what a failure is blamed on: "model" from the request to reading its answer
        try:
            while True:
                source = "model"
                t0 = time.perf_counter()
                response = await self.get_model_response(client, model, messages, sampling, state)
                elapsed = (time.perf_counter() - t0) * 1000
                generation_ms += elapsed
                turn, assistant = _turn_from_response(response, len(messages), elapsed)
                source = "environment"
                rollout.turns.append(turn)
                usage = getattr(response, "usage", None)
                if usage is not None:
                    rollout.token_usage["prompt_tokens"] += int(usage.prompt_tokens or 0)
                    rollout.token_usage["completion_tokens"] += int(usage.completion_tokens or 0)
                messages.append(assistant)
                rollout.completion.append(assistant)
                state["turn"] += 1
                if turn.finish_reason == "length":  # this turn hit max_tokens; later turns still happen
                    rollout.is_truncated = True
                if await self.is_completed(messages, state):
                    rollout.stop_condition = state.get("stop_condition", "completed")
                    break
                if state["turn"] >= self.max_turns:
                    rollout.stop_condition = "max_turns"
                    break
                reply, state = await self.env_response(messages, state)
                messages.extend(reply)
                rollout.completion.extend(reply)
                if await self.is_completed(messages, state):
                    rollout.stop_condition = state.get("stop_condition", "completed")
                    break
        except Exception as exc:  # the endpoint or env_response failed: record it on this rollout, go on
            rollout.error, rollout.stop_condition, rollout.error_source = error_text(exc), "error", source
        finally:
            try:
                await self.cleanup_state(state)
            except Exception as exc:
                rollout.error = "\n".join([*([rollout.error] if rollout.error else []),
                                           f"cleaning up the rollout failed: {error_text(exc)}"])
                rollout.error_source = rollout.error_source or "environment"
        rollout.timing["generation_ms"] = generation_ms
        rollout.timing["total_ms"] = (time.perf_counter() - started) * 1000
        return rollout


def _is_api_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith(("openai", "httpx", "httpcore"))


class SingleTurnEnv(MultiTurnEnv):
    """One model turn per rollout."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 1)
        super().__init__(**kwargs)

    async def is_completed(self, messages: Messages, state: State) -> bool:
        return state["turn"] >= 1
