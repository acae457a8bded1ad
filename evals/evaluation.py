"""Evaluation: an environment's rollouts against an OpenAI-compatible endpoint, scored, written as verifiers does.

Writes `results.jsonl` (one row per rollout, appended as each finishes, so nothing done is lost to a crash) and
`metadata.json`, streams `eval` events into the run's event log, and ends with the reward statistics and the
readiness verdict for RL (`evals.readiness`: ready, not ready or not a baseline, each check a pass or a problem).

A system prompt given for the evaluation (`--system-prompt-file`, a GEPA run's best prompt) replaces each row's
system message (or opens a prompt that has none), as GEPA's environment adapter does with a candidate's: the
environment's rollout reads the row's prompt, so it sees the prompt exactly as GEPA scored it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from prime_lab.envs import (
    Environment,
    Rollout,
    SamplingArgs,
    host_code,
    isolated,
    load_environment,
    redact,
    replace_system_prompt,
)
from prime_lab.envs.environment import DEFAULT_ROLLOUT_TIMEOUT_S
from prime_lab.envs.judges import JudgeConfig
from prime_lab.envs.tool_prompt import ToolPrompts
from prime_lab.evals.readiness import Readiness, RewardStats, assess
from prime_lab.models.resolve import local_tokenizer
from prime_lab.problems.schema import ConfigSection
from prime_lab.problems.validation import Validation, validate_file
from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run, RunError, RunRegistry
from prime_lab.sandbox.config import SandboxConfig
from prime_lab.sandbox.stats import NoticeFollower

SAMPLE_EVENTS = 3  # rollouts sent whole as `sample` events (the rest are summarised)
TOOLS_SETTING = "[sampling] tools_in_system_prompt = true (prime eval run: -S '{\"tools_in_system_prompt\": true}')"


@dataclass
class EvalSpec:
    env_id: str
    model: str  # the name sent to the endpoint
    base_url: str
    env_args: dict[str, Any] = field(default_factory=dict)
    num_examples: int = 5
    rollouts_per_example: int = 3
    sampling: SamplingArgs = field(default_factory=SamplingArgs)
    max_concurrent: int = 32
    api_key_var: str | None = None
    seed: int | None = None
    request_timeout: float = 600.0
    system_prompt: str | None = None  # replaces every row's system message
    metadata: dict[str, Any] = field(default_factory=dict)  # more for metadata.json: the policy, the prompt's source
    rollout_timeout: float | None = DEFAULT_ROLLOUT_TIMEOUT_S  # one rollout's limit (the environment's own if smaller)
    model_source: str | None = None  # the model on this machine (preset, folder, id) whose chat template is checked
    tools_in_system_prompt: bool = False  # tool schemas into the system prompt where that template drops `tools`


@dataclass(frozen=True)
class SystemPrompt:
    """A system prompt for an evaluation and where it came from."""

    text: str
    path: Path
    gepa_run: str | None = None  # the GEPA run whose best prompt it is

    def metadata(self) -> dict[str, Any]:
        return {"text": self.text, "source": str(self.path), "gepa_run": self.gepa_run}


class SystemPromptError(ValueError):
    """`--system-prompt-file` names neither a readable file nor a GEPA run with a best prompt."""


def read_system_prompt(spec: str, registry: RunRegistry | None = None) -> SystemPrompt:
    """The prompt in the file `spec`, or the best prompt of the GEPA run `spec` (`gepa/best_prompt.txt`)."""
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            return SystemPrompt(path.read_text(encoding="utf-8").strip(), path.resolve())
        except (OSError, UnicodeDecodeError) as exc:
            raise SystemPromptError(f"--system-prompt-file {spec}: cannot read it: {exc}") from None
    if path.exists() or "/" in spec:
        raise SystemPromptError(f"--system-prompt-file {spec}: not a file" if path.exists() else
                                f"--system-prompt-file {spec}: no such file")
    try:
        run = (registry or RunRegistry()).get(spec)
    except RunError:
        raise SystemPromptError(f"--system-prompt-file {spec}: neither a file nor a GEPA run's id "
                                "(`prime gepa list`)") from None
    kind = run.read_status().get("kind")
    if kind != "gepa":
        raise SystemPromptError(f"--system-prompt-file {spec}: run {run.id} is a {kind} run, not a GEPA run: only a "
                                "GEPA run has a best prompt")
    best = run.gepa_dir / "best_prompt.txt"
    if not best.is_file():
        raise SystemPromptError(f"--system-prompt-file {spec}: GEPA run {run.id} has no best prompt yet ({best})")
    return SystemPrompt(best.read_text(encoding="utf-8").strip(), best.resolve(), gepa_run=run.id)


def with_system_prompt(rows: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """The rows with their system message replaced by `system_prompt` as GEPA replaces it (None: the rows as
    they are)."""
    if system_prompt is None:
        return rows
    return [replace_system_prompt(row, system_prompt) for row in rows]


@dataclass
class EvalResult:
    rollouts: list[Rollout]
    metadata: dict[str, Any]
    report: RewardStats
    readiness: Readiness
    output_dir: Path

    @property
    def failed(self) -> int:
        """The rollouts that failed, wherever they failed (their scorer included): the verdict's count."""
        return self.report.errors


def default_output_dir(env_id: str, model: str, run_id: str, root: Path | None = None) -> Path:
    """`outputs/evals/<env>--<model>/<run-id>/`, the place verifiers and Prime's Lab look for evaluations."""
    return (root or Path("outputs") / "evals") / f"{_short_name(env_id)}--{_short_name(model)}" / run_id


def _short_name(name: str) -> str:
    """`owner/name` -> `name`; a path -> its last part."""
    return Path(name.rstrip("/")).name or name


def run_evaluation(
    spec: EvalSpec,
    output_dir: Path,
    *,
    run: Run | None = None,
    env: Environment | None = None,
    on_progress: Callable[[int, int, Rollout], None] | None = None,
    announce: Callable[[str], None] | None = None,
) -> EvalResult:
    """Evaluate; raises EnvironmentLoadError for a bad id or args (before anything is written). `announce` is told
    the warnings for the user (tools the model's chat template does not show)."""
    from openai import AsyncOpenAI

    if run is not None:  # an environment at its own verifiers release serves this run: its log goes with the run's
        isolated.serve_for(run)
    env = env or load_environment(spec.env_id, **spec.env_args)
    own_rows = env.get_eval_dataset(spec.num_examples, seed=spec.seed)
    rows = with_system_prompt(own_rows, spec.system_prompt)
    total = len(rows) * spec.rollouts_per_example
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / "results.jsonl"
    results_path.write_text("")
    writer = run.writer("eval") if run is not None else None
    rows = with_tools_shown(spec, env, rows, writer, announce)
    for line in host_code.warnings_for([spec.env_id]):  # its own code runs what the model writes, on this machine
        _teller(writer, announce)(line, "WARNING")
    # what its sandboxes say once (a command without the network names the setting), whichever process made them
    notices = NoticeFollower(run.dir if run is not None else None)

    def tell_notices() -> None:
        for message in notices.take():
            _teller(writer, announce)(message, "WARNING")
    api_key = os.environ.get(spec.api_key_var, "") if spec.api_key_var else ""
    client = AsyncOpenAI(base_url=spec.base_url, api_key=api_key or "EMPTY", max_retries=1,
                         timeout=spec.request_timeout)
    done = 0
    rewards: list[float] = []
    written: list[dict[str, Any]] = []  # the rows of results.jsonl, for the verdict
    started = time.perf_counter()

    def on_rollout(rollout: Rollout) -> None:
        nonlocal done
        done += 1
        rewards.append(rollout.reward)
        row = redact(rollout.result_row())
        written.append(row)
        with open(results_path, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        if writer is not None:
            writer.emit("eval", {"done": done, "total": total, "reward": rollout.reward,
                                 "avg_reward": sum(rewards) / len(rewards), "example_id": rollout.example_id,
                                 "error": bool(rollout.error)}, step=done)
            if done <= SAMPLE_EVENTS:
                writer.emit("sample", {"task": rollout.task, "example_id": rollout.example_id,
                                       "prompt": row["prompt"], "completion": row["completion"],
                                       "answer": row["answer"], "reward": rollout.reward,
                                       "metrics": rollout.metrics}, step=done)
        if run is not None:
            run.update_status(step=done, max_steps=total, reward=sum(rewards) / len(rewards))
        tell_notices()
        if on_progress is not None:
            on_progress(done, total, rollout)

    async def evaluate() -> list[Rollout]:
        try:
            return await env.run_rollouts(client, spec.model, rows, spec.sampling,
                                          rollouts_per_example=spec.rollouts_per_example,
                                          max_concurrent=spec.max_concurrent, on_rollout=on_rollout,
                                          timeout=spec.rollout_timeout)
        finally:
            await client.close()

    try:
        rollouts = asyncio.run(evaluate())
    finally:
        tell_notices()
        if writer is not None:
            writer.close()
    elapsed_ms = (time.perf_counter() - started) * 1000
    stats = RewardStats.from_rows(written)
    metric_names = sorted({k for r in rollouts for k in r.metrics})
    metadata = redact({
        "env_id": spec.env_id, "env_args": spec.env_args, "model": spec.model, "base_url": spec.base_url,
        "num_examples": len(rows), "rollouts_per_example": spec.rollouts_per_example,
        "sampling_args": asdict(spec.sampling), "date": datetime.now().isoformat(timespec="seconds"),
        "time_ms": elapsed_ms, "avg_reward": stats.avg_reward,
        "avg_metrics": {k: sum(r.metrics.get(k, 0.0) for r in rollouts) / len(rollouts) for k in metric_names}
        if rollouts else {},
        "difficulty": asdict(stats), "errors": stats.errors,
        "env_system_prompt": _system_message(own_rows), "format_hint": _format_hint(env),
        "run_id": run.id if run is not None else None, **spec.metadata,
        **({"sandbox_notices": notices.messages} if notices.messages else {}),
    })
    readiness = assess(written, metadata)
    metadata["readiness"] = readiness.to_dict()
    (output_dir / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    return EvalResult(rollouts, metadata, stats, readiness, output_dir)


def with_tools_shown(spec: EvalSpec, env: Environment, rows: list[dict[str, Any]], writer: EventWriter | None,
                     announce: Callable[[str], None] | None) -> list[dict[str, Any]]:
    """The rows with the environment's tool schemas in their system messages where the model's chat template drops
    `tools` and `spec.tools_in_system_prompt` asks; either way said once, as an event and to `announce`
    (envs/tool_prompt.py)."""
    model = spec.model_source or spec.model
    return ToolPrompts(model, lambda: local_tokenizer(model), enabled=spec.tools_in_system_prompt,
                       log=_teller(writer, announce), setting=TOOLS_SETTING).rows(spec.env_id, env, rows)


def _teller(writer: EventWriter | None, announce: Callable[[str], None] | None) -> Callable[[str, str], None]:
    """Saying a line to the user: as an event of the run and to `announce`."""
    def say(message: str, level: str) -> None:
        if writer is not None:
            writer.log(message, level)
        if announce is not None:
            announce(f"{level}: {message}")

    return say


def _system_message(rows: list[dict[str, Any]]) -> str | None:
    """The environment's own system prompt: the system message its first row opens with (None without one)."""
    prompt = rows[0].get("prompt") if rows else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system":
        return str(prompt[0].get("content") or "")
    return None


def _format_hint(env: Environment) -> str:
    """The environment's parser's format hint ('' where it gives none or cannot say)."""
    try:
        return str(env.parser.format_hint() or "")
    except Exception:  # an environment's own parser: its hint is a nicety, never a reason to lose the results
        return ""


# ------------------------------------------------------------------------------------------------------------
# The TOML form of `prime eval run @eval.toml`.

class EvalEnvSection(ConfigSection):
    id: str
    args: dict[str, Any] = Field(default_factory=dict)


class EvalFileConfig(ConfigSection):
    env: EvalEnvSection
    model: str | None = None
    num_examples: int = 5
    rollouts_per_example: int = Field(default=3, ge=1)
    sampling: dict[str, Any] = Field(default_factory=dict)
    base_url: str | None = None
    adapter: str | None = None  # RUN[:STEP], as --adapter
    system_prompt_file: str | None = None  # a file (relative to this config) or a GEPA run's id
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)  # where its sandboxes run (as --sandbox)
    judge: JudgeConfig | None = None  # the environment's LLM judge, started here (as --judge MODEL)

    @field_validator("num_examples")
    @classmethod
    def _num(cls, value: int) -> int:
        if value == -1 or value >= 1:
            return value
        raise ValueError("must be -1 (all examples) or at least 1")


def validate_eval_file(path: Path) -> Validation[EvalFileConfig]:
    return validate_file(path, EvalFileConfig)
