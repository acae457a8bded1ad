"""Environments written against the real `verifiers` package (its classic API) run here unchanged.

The loader wraps what such an environment's `load_environment` returns in `VerifiersEnvironment`, which speaks our
protocol (`Environment`: rows, `rollout`, `run_rollouts`, `system_prompt`, `parser`) by calling verifiers' own entry
point, `env.run_group(inputs, client, model, sampling_args, state_columns=["trajectory"])`: the environment's own
rollout loop, `env_response`, stop conditions, tools and rubric run as that release runs them, against our endpoint
through verifiers' own client wrapper around the same AsyncOpenAI client. Each step of the returned trajectory
becomes a `Turn` (prompt and completion token ids and the sampler's logprobs, present when the request asked for
them, as `SamplingArgs.rl_fields` does), the reward and per-function metrics come from its rubric.

Supported releases: `SUPPORTED` (0.1.12 brought the async `run_group` and `vf.clients`; 0.4.0 dropped the classic
API). This module imports verifiers lazily (the standard library and our protocol at import time), so
`prime_lab.envs` never pulls verifiers in.

Not mapped: group reward functions see a group of one when the RL orchestrator samples rollout by rollout (they
see the whole group in `run_rollouts`, i.e. evaluation and GEPA); completion-style environments (a string prompt,
`message_type="completion"`); verifiers' environment server (`ZMQEnvServer`): environments run in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import inspect
import json
import re
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prime_lab.envs import hub
from prime_lab.envs.arguments import EnvironmentLoadError, env_args
from prime_lab.envs.environment import (
    DEFAULT_ROLLOUT_TIMEOUT_S,
    Environment,
    Rollout,
    SamplingArgs,
    Turn,
    cut_after,
    may_fail,
    raised_rollout,
    rollout_time_limit,
    sample_rows,
    timed_out_rollout,
)
from prime_lab.envs.environment import failed_rollout as row_failed
from prime_lab.envs.parsers import Messages, Parser
from prime_lab.envs.rubric import Rubric

SUPPORTED = ">=0.1.12,<0.4"
OLDEST, FIRST_UNSUPPORTED = (0, 1, 12), (0, 4)
INPUT_KEY = "verifiers_input"  # our row's copy of the verifiers dataset row (every column but the prompt)
_STATE_SKIP = ("prompt", "completion", "trajectory", "info", "answer")
_signal_lock = threading.RLock()  # re-entrant: a rebuild may run inside a load


# Recognising a verifiers environment, and which release runs it ---------------------------------------------------

def is_verifiers_environment(obj: object) -> bool:
    """Whether `obj` is a classic verifiers Environment (checked by class, without importing verifiers)."""
    if "verifiers" not in sys.modules:
        return False
    return any(cls.__name__ == "Environment" and cls.__module__.startswith("verifiers.")
               for cls in type(obj).__mro__)


def installed_release() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_tuple(version: str) -> tuple[int, ...]:
    """`0.1.12.post1` -> (0, 1, 12): the numeric release, enough to compare against our range."""
    parts: list[int] = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def is_supported(version: str) -> bool:
    return OLDEST <= release_tuple(version) < FIRST_UNSUPPORTED


def declared_requirement(module_name: str) -> str | None:
    """What the environment's package declares for verifiers: its installed metadata, else the pyproject.toml
    beside (or above) its module, as an environment folder from a verifiers repository has it."""
    top = module_name.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        for requirement in importlib.metadata.requires(dist) or []:
            if _names_verifiers(requirement):
                return f"{requirement.split(';')[0].strip()} (package {dist})"
    module = sys.modules.get(module_name)
    origin = getattr(module, "__file__", None)
    if origin is None:  # its import failed: find its file without importing it
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(top)
            origin = spec.origin if spec is not None else None
    if origin:
        for folder in list(Path(origin).resolve().parents)[:2]:
            pyproject = folder / "pyproject.toml"
            if pyproject.is_file():
                try:
                    project = tomllib.loads(pyproject.read_text()).get("project", {})
                except (OSError, tomllib.TOMLDecodeError):
                    return None
                for requirement in project.get("dependencies", []):
                    if _names_verifiers(requirement):
                        return f"{requirement} ({pyproject})"
                return None
    return None


def _names_verifiers(requirement: str) -> bool:
    name = re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]
    return name.lower().replace("_", "-") == "verifiers"


def release_note(module_name: str) -> str:
    """`verifiers 0.3.1 is installed; the environment declares verifiers>=0.1.3,<0.1.6 (...)`."""
    installed = installed_release()
    declared = declared_requirement(module_name) if module_name else None
    return (f"verifiers {installed or '(none)'} is installed (prime-lab supports verifiers{SUPPORTED}); "
            f"environment '{module_name}' declares {declared or 'no verifiers requirement'}")


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Build verifiers environments inside this block. A verifiers Environment installs its own SIGINT and SIGTERM
    handlers when it is built (tear down, then exit 143), replacing the caller's (a run's graceful stop), and fails
    off the main thread ("signal only works in main thread"). Inside the block handlers installed off the main
    thread are ignored and the main thread's handlers are put back afterwards."""
    with _signal_lock:
        original = signal.signal
        main = threading.current_thread() is threading.main_thread()
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}

        def install(signum: Any, handler: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                return signal.getsignal(signum)
            return original(signum, handler)

        signal.signal = install  # type: ignore[assignment]
        try:
            yield
        finally:
            signal.signal = original
            for signum, handler in saved.items():
                if handler is not None:
                    original(signum, handler)


# Loading -----------------------------------------------------------------------------------------------------------

def wrap(env: Any, *, env_id: str, load: Callable[..., Any] | None = None,
         load_args: Mapping[str, Any] | None = None,
         reload: Callable[..., Environment] | None = None) -> VerifiersEnvironment:
    """Our protocol over a verifiers environment that `load(**load_args)` built (raises EnvironmentLoadError when
    the installed release is outside the supported range or the environment is of a kind we cannot run). `reload(
    **args)` builds it again the loader's way (offline Hub, its messages): `with_system_prompt` does, when `load`
    takes a system prompt."""
    module = getattr(load, "__module__", "") or ""
    installed = installed_release()
    if installed is None or not is_supported(installed):
        raise EnvironmentLoadError(f"environment '{env_id}' is a verifiers environment, but {release_note(module)}. "
                                   f"Install a supported release: pip install -c constraints.txt "
                                   f"'prime-lab[verifiers]'")
    message_type = getattr(env, "message_type", "chat")
    if message_type != "chat":
        raise EnvironmentLoadError(f"environment '{env_id}': message_type={message_type!r} (completion-style "
                                   "prompts) is not supported; prime-lab runs chat environments")
    wrapped = VerifiersEnvironment(env, env_id=env_id, load=load, load_args=load_args, reload=reload)
    try:  # now, inside the loader's offline-Hub block: verifiers builds a dataset given as a function lazily
        wrapped.get_dataset()
    except Exception as exc:
        arguments = {**{a.name: a.default for a in env_args(load) if not a.required}, **(load_args or {})} \
            if load is not None else dict(load_args or {})
        raise EnvironmentLoadError(hub.failure_message(exc, env_id, arguments) or (
            f"environment '{env_id}': building its dataset raised {type(exc).__name__}: {exc}{_where(exc, module)} "
            f"({release_note(module)})")) from exc
    return wrapped


def takes_system_prompt(load: Callable[..., Any] | None) -> bool:
    if load is None:
        return False
    try:
        return "system_prompt" in inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False


# Conversions (pure: verifiers' dicts in, ours out) -------------------------------------------------------------------

def _field(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a verifiers value that is a dict in one release and a pydantic model in another."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _message(message: Any) -> dict[str, Any]:
    """A chat message as a plain dict without empty fields (datasets fill absent keys with None), its tool calls in
    OpenAI's shape (verifiers writes them as JSON strings of `{id, name, arguments}`)."""
    if not isinstance(message, Mapping):
        dump = getattr(message, "model_dump", None)
        message = dump() if callable(dump) else dict(message)
    out = {k: v for k, v in message.items() if v is not None}
    if out.get("tool_calls"):
        out["tool_calls"] = [_tool_call(c) for c in out["tool_calls"]]
    return out


def _tool_call(call: Any) -> Any:
    if isinstance(call, str):
        try:
            call = json.loads(call)
        except ValueError:
            return call
    if isinstance(call, Mapping) and "function" not in call and "name" in call:
        return {"id": call.get("id"), "type": "function",
                "function": {"name": call["name"], "arguments": call.get("arguments")}}
    return call


def _messages(messages: Any) -> Messages:
    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [_message(m) for m in messages]


def to_row(vf_row: Mapping[str, Any], task: str) -> dict[str, Any]:
    """A row of a verifiers dataset (after its own formatting: `prompt`, `example_id`, maybe `answer`, `info`,
    `task` and the environment's own columns) as ours; the whole verifiers row rides along for the rollout."""
    info = vf_row.get("info") or {}
    if isinstance(info, str):
        info = json.loads(info) if info.strip() else {}
    return {"example_id": vf_row.get("example_id"), "prompt": _messages(vf_row.get("prompt")),
            "answer": vf_row.get("answer", ""), "info": dict(info), "task": task,
            INPUT_KEY: {k: v for k, v in vf_row.items() if k != "prompt"}}


def to_input(row: Mapping[str, Any]) -> dict[str, Any]:
    """Our row back into verifiers' RolloutInput: its own columns, with our prompt (GEPA may have replaced the
    system message)."""
    original = row.get(INPUT_KEY)
    if original is None:  # a row made by hand: only the protocol's fields
        example_id = row.get("example_id")
        original = {"example_id": example_id if isinstance(example_id, int) else 0, "answer": row.get("answer", ""),
                    "info": row.get("info") or {}}
    return {**original, "prompt": [dict(m) for m in row["prompt"]]}


def request_args(env_sampling: Mapping[str, Any] | None, sampling: SamplingArgs) -> dict[str, Any]:
    """verifiers' sampling_args: the environment's own defaults, then ours (extra_body merged)."""
    args = {k: v for k, v in (env_sampling or {}).items() if k != "extra_body"}
    extra = dict((env_sampling or {}).get("extra_body") or {})
    ours = sampling.request_kwargs()
    extra.update(ours.pop("extra_body", {}))
    args.update(ours)
    if extra:
        args["extra_body"] = extra
    return args


def to_turn(step: Mapping[str, Any], generation_ms: float = 0.0) -> Turn:
    """One trajectory step: the model call's tokens (when the request asked for them) and finish reason."""
    tokens = step.get("tokens") or {}
    message = _field(step.get("response"), "message")
    logprobs = tokens.get("completion_logprobs")
    return Turn(prompt_token_ids=_ints(tokens.get("prompt_ids")),
                completion_token_ids=_ints(tokens.get("completion_ids")),
                completion_logprobs=[float(x) for x in logprobs] if logprobs is not None else None,
                finish_reason=_field(message, "finish_reason"), prompt_messages=len(step.get("prompt") or []),
                generation_ms=generation_ms)


def _ints(values: Any) -> list[int] | None:
    return [int(v) for v in values] if values is not None else None


def _timing_ms(timing: Any) -> tuple[dict[str, float], list[float]]:
    """verifiers' rollout timing as `<phase>_ms` numbers, and the model calls' durations in ms (0.1.x writes
    `generation_ms`..., later releases spans in seconds)."""
    if not isinstance(timing, Mapping):
        dump = getattr(timing, "model_dump", None)
        timing = dump() if callable(dump) else {}
    out: dict[str, float] = {}
    calls: list[float] = []
    for key, value in timing.items():
        if isinstance(value, (int, float)) and key.endswith("_ms"):
            out[key] = float(value)
        elif isinstance(value, Mapping) and isinstance(value.get("duration"), (int, float)):
            out[f"{key}_ms"] = float(value["duration"]) * 1000
            if key == "model":
                calls = [float(s.get("duration") or 0.0) * 1000 for s in value.get("spans") or []]
    return out, calls


def _error_text(output: Mapping[str, Any]) -> str | None:
    error = output.get("error")
    if not error:
        return None
    chain = output.get("error_chain") or _field(error, "error_chain_repr")
    return str(chain or _field(error, "message") or error)


# verifiers' errors of the model's side (`vf.ModelError` and its kinds, around the client's own) in an error's chain
MODEL_ERRORS = ("ModelError", "ModelResponseError", "APIConnectionError", "APITimeoutError", "APIStatusError")


def _error_source(output: Mapping[str, Any], error: str) -> str:
    """`Rollout.error_source` of a verifiers rollout that failed: "model" where its chain of errors names the model's
    side, else "environment" (verifiers records no error of a reward function: one that raises scores 0)."""
    chain = f"{output.get('error_chain') or ''} {_field(output.get('error'), 'error_chain_str') or ''} {error}"
    return "model" if any(name in chain for name in MODEL_ERRORS) else "environment"


def to_rollout(output: Mapping[str, Any], row: Mapping[str, Any], elapsed_ms: float) -> Rollout:
    """A scored verifiers RolloutOutput (with the `trajectory` state column) as our Rollout."""
    steps = list(output.get("trajectory") or [])
    timing, calls = _timing_ms(output.get("timing"))
    if len(calls) != len(steps):
        calls = [timing.get("generation_ms", 0.0) / max(1, len(steps))] * len(steps)
    turns = [to_turn(step, ms) for step, ms in zip(steps, calls, strict=True)]
    usage = output.get("token_usage") or {}
    error = _error_text(output)
    rollout = Rollout(
        example_id=row.get("example_id"), task=str(row.get("task", "")), prompt=_messages(output.get("prompt"))
        or [dict(m) for m in row["prompt"]], completion=_messages(output.get("completion")),
        answer=row.get("answer", ""), info=dict(row.get("info") or {}), reward=float(output.get("reward") or 0.0),
        metrics={k: float(v) for k, v in (output.get("metrics") or {}).items() if isinstance(v, (int, float))},
        turns=turns, is_truncated=bool(output.get("is_truncated")),
        stop_condition="error" if error else str(output.get("stop_condition") or "completed"), error=error,
        error_source=_error_source(output, error) if error else None,
        timing={**timing, "total_ms": timing.get("total_ms", elapsed_ms)},
        token_usage={"prompt_tokens": int(usage.get("input_tokens") or 0),
                     "completion_tokens": int(usage.get("output_tokens") or 0)},
        state={k: v for k, v in output.items() if k not in _STATE_SKIP})
    if not usage and turns:
        rollout.token_usage = {"prompt_tokens": sum(len(t.prompt_token_ids or []) for t in turns),
                               "completion_tokens": sum(len(t.completion_token_ids or []) for t in turns)}
    return rollout


def failed_rollout(row: Mapping[str, Any], error: str, elapsed_ms: float) -> Rollout:
    """The failed rollout of a row of a group that failed as a whole, blamed as verifiers' errors are."""
    return row_failed(row, error, elapsed_ms, _error_source({}, error))


def replace_system_message(prompt: Messages, system_prompt: str | None) -> Messages:
    """The prompt with its system message replaced by (or, without one, preceded by) `system_prompt`."""
    out = [dict(m) for m in prompt]
    if out and out[0].get("role") == "system":
        if system_prompt is None:
            return out[1:]
        out[0]["content"] = system_prompt
    elif system_prompt:
        out.insert(0, {"role": "system", "content": system_prompt})
    return out


class ParserView(Parser):
    """The environment's own verifiers parser behind our Parser interface (the samples browser shows its answer)."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser

    def parse(self, text: str) -> str | None:
        return self.parse_answer(text)

    def parse_answer(self, completion: Messages | str) -> str | None:
        answer = self.parser.parse_answer(completion)
        return None if answer is None else str(answer)

    def format_hint(self) -> str:
        describe = getattr(self.parser, "get_format_str", None)
        return str(describe()) if callable(describe) else ""


def rubric_view(rubric: Any, parser: Parser) -> Rubric:
    """The environment's reward functions and weights, for showing (verifiers' rubric does the scoring)."""
    try:
        funcs, weights = list(rubric._get_reward_funcs()), list(rubric._get_reward_weights())
    except Exception:  # a rubric of another shape: show none
        funcs, weights = [], []
    return Rubric(funcs, weights if len(weights) == len(funcs) else None, parser=parser)


# The environment -----------------------------------------------------------------------------------------------

class GroupEnvironment(Environment):
    """What a verifiers environment is behind our protocol wherever it runs (in this process, or in its own
    interpreter: isolated.py): rows in verifiers' format, converted (`to_row`), and rollouts run a group at a time
    by verifiers itself and already scored (`run_group`). GEPA's candidates replace the rows' first system message,
    which is where verifiers puts `system_prompt` when it formats a dataset."""

    env_id: str
    sampling_args: dict[str, Any]

    def _reset_rows(self) -> None:
        self._prompt_override = False
        self._train: list[dict[str, Any]] | None = None
        self._eval: list[dict[str, Any]] | None = None

    def _split(self, split: str) -> list[dict[str, Any]] | None:
        """The split's verifiers rows (`dataset` or `eval_dataset`), None when the environment has no such split."""
        raise NotImplementedError

    def _build(self, split: str) -> list[dict[str, Any]] | None:
        rows = self._split(split)
        return None if rows is None else [self._view(to_row(r, self.task)) for r in rows]

    def _view(self, row: dict[str, Any]) -> dict[str, Any]:
        if self._prompt_override:
            row["prompt"] = replace_system_message(row["prompt"], self.system_prompt)
        return row

    def _datasets(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if self._train is None:
            self._train = self._build("dataset") or []
            self._eval = self._build("eval_dataset")
            if not self._train and not self._eval:
                raise ValueError(f"environment '{self.env_id}' has neither a dataset nor an eval_dataset")
        return self._train, self._eval

    def get_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        train, evaluation = self._datasets()
        return sample_rows(train or evaluation or [], n, seed)

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
        train, evaluation = self._datasets()
        return sample_rows(evaluation if evaluation is not None else train, n, seed)

    def override_system_prompt(self, system_prompt: str | None) -> Environment:
        """Every row's first system message becomes `system_prompt` (added where a row has none)."""
        self.system_prompt = system_prompt
        self._prompt_override = True
        self._train = self._eval = None
        return self

    # Rollouts --------------------------------------------------------------------------------------------------
    async def run_group(self, client: Any, model: str, rows: Sequence[dict[str, Any]],
                        sampling: SamplingArgs) -> list[Rollout]:
        """The rows' rollouts as one verifiers group (its rubric scores them together), converted."""
        raise NotImplementedError

    async def rollout(self, client: Any, model: str, row: dict[str, Any], sampling: SamplingArgs) -> Rollout:
        """One rollout, already scored by the environment's rubric (`score` has nothing left to do)."""
        return (await self.run_group(client, model, [row], sampling))[0]

    async def score(self, rollout: Rollout) -> None:
        return None

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
        """Each row's `rollouts_per_example` rollouts as one verifiers group, at most `max_concurrent` rollouts in
        flight; results in order. A group's rollouts run side by side, so the group has the time limit of one
        (`rollout_time_limit(self, timeout)`): past it, each of its rollouts fails as timed out. A group that raises
        fails each of its rollouts (`raised_rollout`; EnvironmentDown goes through)."""
        per_group = max(1, rollouts_per_example)
        gate = asyncio.Semaphore(max(1, max_concurrent // per_group))
        limit = rollout_time_limit(self, timeout)

        async def timed_group(rows: list[dict[str, Any]]) -> list[Rollout]:
            started = time.perf_counter()
            try:
                return await cut_after(limit, self.run_group(client, model, rows, sampling),
                                       lambda elapsed_ms: [timed_out_rollout(r, limit or 0.0, elapsed_ms)
                                                           for r in rows])
            except Exception as exc:
                if not may_fail(exc):
                    raise
                return [raised_rollout(r, exc, (time.perf_counter() - started) * 1000) for r in rows]

        async def group(row: dict[str, Any]) -> list[Rollout]:
            async with gate:
                rollouts = await timed_group([row] * per_group)
            for rollout in rollouts:
                if on_rollout is not None:
                    maybe = on_rollout(rollout)
                    if asyncio.iscoroutine(maybe):
                        await maybe
            return rollouts

        groups = await asyncio.gather(*(group(row) for row in rows))
        return [r for g in groups for r in g]


class VerifiersEnvironment(GroupEnvironment):
    """A verifiers environment in this process, behind our protocol; `env` is the verifiers environment itself.

    System prompt (GEPA): verifiers puts `system_prompt` into every row's prompt when it formats a dataset, and its
    rollout reads only the row's prompt. So GEPA's candidates, which replace the rows' first system message, reach
    the environment exactly as its own system prompt would. `with_system_prompt` (a whole environment with another
    prompt) builds the environment again with `load_environment(system_prompt=...)` when that function takes it
    (so a prompt the environment uses elsewhere changes too), and otherwise rewrites the rows' first system
    message.
    """

    def __init__(self, env: Any, *, env_id: str = "", load: Callable[..., Any] | None = None,
                 load_args: Mapping[str, Any] | None = None,
                 reload: Callable[..., Environment] | None = None) -> None:
        self.env_id = env_id
        self.load = load
        self.reload = reload
        self.module = getattr(load, "__module__", "") or type(env).__module__
        self._adopt(env, dict(load_args or {}))

    def _adopt(self, env: Any, load_args: dict[str, Any]) -> None:
        self.env = env
        self.load_args = load_args
        self.system_prompt = getattr(env, "system_prompt", None)
        self.few_shot = getattr(env, "few_shot", None)
        self.parser = ParserView(env.parser)
        self.rubric = rubric_view(env.rubric, self.parser)
        self.sampling_args = dict(getattr(env, "sampling_args", None) or {})
        self.timeout_seconds = getattr(env, "timeout_seconds", None)  # verifiers' own limit (MultiTurnEnv)
        self._reset_rows()

    def _split(self, split: str) -> list[dict[str, Any]] | None:
        if getattr(self.env, split, None) is None and getattr(self.env, f"{split}_source", None) is None:
            return None
        dataset = getattr(self.env, f"get_{split}")()
        return dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)

    def with_system_prompt(self, system_prompt: str | None) -> Environment:
        if not (takes_system_prompt(self.load) and self.reload is not None):
            return self.override_system_prompt(system_prompt)
        args = {**self.load_args, "system_prompt": system_prompt}
        with kept_signal_handlers():
            rebuilt = self.reload(**args)  # the loader's way: offline Hub, its messages
        assert isinstance(rebuilt, VerifiersEnvironment)
        self._adopt(rebuilt.env, args)
        return self

    async def run_group(self, client: Any, model: str, rows: Sequence[dict[str, Any]],
                        sampling: SamplingArgs) -> list[Rollout]:
        import verifiers as vf

        started = time.perf_counter()
        inputs = [to_input(r) for r in rows]
        try:
            outputs = await self.env.run_group(inputs, vf.clients.OpenAIChatCompletionsClient(client), model,
                                               request_args(self.sampling_args, sampling),
                                               state_columns=["trajectory"])
        except Exception as exc:  # the environment's own code failed: say which release runs it
            elapsed = (time.perf_counter() - started) * 1000
            message = f"{type(exc).__name__}: {exc}{_where(exc, self.module)} ({release_note(self.module)})"
            return [failed_rollout(r, message, elapsed) for r in rows]
        elapsed = (time.perf_counter() - started) * 1000
        return [to_rollout(o, r, elapsed) for o, r in zip(outputs, rows, strict=True)]


def _where(exc: BaseException, module_name: str) -> str:
    """` at file:line in function`, instead of a traceback: the environment's own innermost frame (else the
    innermost of all)."""
    own = getattr(sys.modules.get(module_name), "__file__", None)
    found = None
    tb = exc.__traceback__
    while tb is not None:
        if found is None or tb.tb_frame.f_code.co_filename == own or found.tb_frame.f_code.co_filename != own:
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    return f" at {Path(code.co_filename).name}:{found.tb_lineno} in {code.co_name}"
