"""An evaluation's lifecycle: its settings (from flags or an `@eval.toml`), the trained policy and system prompt it
names, its run in the registry, the sampler it starts, the evaluation and the run's states.

`prime eval run` is the front end (it parses the flags, shows the progress and prints the summary);
`gepa/launcher.py` and `trainer/launcher.py` are the GEPA and RL counterparts. Everything a user can fix comes out
as `EvalLaunchError` (an invalid config as `EvalConfigError`, with its problems), the run already marked `failed`
where one exists; a stop comes out as `runs.registry.RunStopped` (Ctrl-C as KeyboardInterrupt), the run `stopped`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prime_lab.envs.tool_prompt import KEY as TOOLS_KEY
from prime_lab.models.presets import DEFAULT_MODEL
from prime_lab.runs.registry import Run, RunRegistry, working
from prime_lab.runs.system_metrics import sampling
from prime_lab.sandbox.config import SandboxConfig, applied

if TYPE_CHECKING:
    from prime_lab.envs import Environment, Rollout, SamplingArgs
    from prime_lab.evals.evaluation import EvalFileConfig, EvalResult, SystemPrompt
    from prime_lab.evals.policies import TrainedPolicy
    from prime_lab.inference.judge import JudgePlan
    from prime_lab.problems.validation import Problem


Announce = Callable[[str], None]
OnProgress = Callable[[int, int, "Rollout"], None]  # rollouts done, rollouts in all, the one just finished


class EvalLaunchError(Exception):
    """A problem the user can fix (an unknown policy, a sampler that did not start, every rollout failing)."""


class EvalConfigError(EvalLaunchError):
    """An `@eval.toml` that does not validate; `problems` says where (file:line), the message which file."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        super().__init__(f"invalid eval config {path}")
        self.problems = problems


@dataclass
class EvalJob:
    """One evaluation: what to evaluate (recorded as the run's config, `to_json`) and how to run it (not recorded)."""

    env_id: str
    model: str | None = None  # None: the policy's base model, or DEFAULT_MODEL
    env_args: dict[str, Any] = field(default_factory=dict)
    num_examples: int = 5
    rollouts_per_example: int = 3
    sampling: dict[str, Any] = field(default_factory=dict)  # the sampling args as given (-S, [sampling])
    base_url: str | None = None  # None: start a local sampler
    adapter: str | None = None  # RUN[:STEP]: a trained policy, served by a sampler started here
    system_prompt_file: str | None = None  # a file or a GEPA run's id
    sandbox: dict[str, Any] = field(default_factory=dict)  # the [sandbox] settings as given (--sandbox, [sandbox])
    judge: dict[str, Any] = field(default_factory=dict)  # the [judge] settings as given (--judge MODEL, [judge])
    # how to run it
    max_tokens: int | None = None  # over sampling's
    temperature: float | None = None  # over sampling's
    max_concurrent: int = 32
    api_key_var: str = "OPENAI_API_KEY"  # read only for a given base_url
    seed: int | None = None  # shuffles the examples
    judge_plan: JudgePlan | None = None  # the judge's (`judge_settings`): its endpoint known before it starts

    def to_json(self) -> dict[str, Any]:
        """The run's config.json and resolved.json: the settings as given, under the keys they have always had."""
        return {"env": self.env_id, "model": self.model, "num_examples": self.num_examples,
                "rollouts": self.rollouts_per_example, "env_args": self.env_args, "sampling": self.sampling,
                "base_url": self.base_url, "adapter": self.adapter, "system_prompt_file": self.system_prompt_file,
                **({"sandbox": self.sandbox} if self.sandbox else {}), **({"judge": self.judge} if self.judge else {})}

    def judge_settings(self) -> AbstractContextManager[Any]:
        """Its judge's endpoint in this process's environment for a block (inference/judge.py): the environment
        loaded in it is wired to the judge, which `evaluate` starts. Raises JudgeUnavailable."""
        from prime_lab.inference.judge import applied_for

        return applied_for(self)

    def sandbox_settings(self, run: Run | None = None) -> AbstractContextManager[None]:
        """Its `[sandbox]` settings (and its run) for the environments this process loads and the servers it starts,
        for the time of a block (sandbox/config.py)."""
        return applied(SandboxConfig.model_validate(self.sandbox), run.dir if run is not None else None)

    @property
    def tools_in_system_prompt(self) -> bool:
        """`tools_in_system_prompt` among the sampling args: ours (envs/tool_prompt.py), never sent."""
        return self.sampling.get(TOOLS_KEY) is True

    def sampling_args(self) -> SamplingArgs:
        """The sampling args given (the keys SamplingArgs has; the others go to the endpoint as `extra_body`, but
        `tools_in_system_prompt`), with max_tokens and temperature over them."""
        from prime_lab.envs import SamplingArgs

        args = SamplingArgs.from_settings({k: v for k, v in self.sampling.items() if k != TOOLS_KEY})
        if self.max_tokens is not None:
            args.max_tokens = self.max_tokens
        if self.temperature is not None:
            args.temperature = self.temperature
        return args


def job_from_config(cfg: EvalFileConfig, path: Path) -> EvalJob:
    """The job the config file `path` describes; its system_prompt_file is read beside the file when it is there."""
    prompt = cfg.system_prompt_file
    if prompt is not None and (path.parent / prompt).is_file():
        prompt = str(path.parent / prompt)
    return EvalJob(env_id=cfg.env.id, model=cfg.model, env_args=cfg.env.args, num_examples=cfg.num_examples,
                   rollouts_per_example=cfg.rollouts_per_example, sampling=cfg.sampling, base_url=cfg.base_url,
                   adapter=cfg.adapter, system_prompt_file=prompt,
                   sandbox=cfg.sandbox.model_dump(exclude_unset=True),
                   judge=cfg.judge.model_dump(exclude_unset=True) if cfg.judge is not None else {})


def read_config(path: Path) -> EvalJob:
    """The job an `@eval.toml` describes; EvalConfigError carries every problem (file:line)."""
    from prime_lab.evals.evaluation import validate_eval_file

    result = validate_eval_file(path)
    if not result.ok or result.config is None:
        raise EvalConfigError(path, result.problems)
    return job_from_config(result.config, path)


def trained_policy(job: EvalJob) -> TrainedPolicy | None:
    """The trained policy `job.adapter` names (None without one); refuses a base_url and a model other than the
    run's base model."""
    from prime_lab.evals.policies import PolicyNotFoundError, resolve_policy

    if not job.adapter:
        return None
    if job.base_url:
        raise EvalLaunchError("--adapter starts a local sampler with the run's policy loaded: leave out -b (to use "
                              "your own server, load the adapter there and give -b with -m ADAPTER_NAME)")
    try:
        return resolve_policy(job.adapter, job.model)
    except PolicyNotFoundError as exc:
        raise EvalLaunchError(str(exc)) from None


def system_prompt(job: EvalJob) -> SystemPrompt | None:
    """The system prompt `job.system_prompt_file` names (None without one): a file's, or a GEPA run's best."""
    from prime_lab.evals.evaluation import SystemPromptError, read_system_prompt

    if not job.system_prompt_file:
        return None
    try:
        return read_system_prompt(job.system_prompt_file)
    except SystemPromptError as exc:
        raise EvalLaunchError(str(exc)) from None


def base_model(job: EvalJob, policy: TrainedPolicy | None) -> str:
    """The model evaluated (or the policy's base): the one given, the policy's base model, or DEFAULT_MODEL."""
    return job.model or (policy.base_model if policy is not None else DEFAULT_MODEL)


def create_run(job: EvalJob, policy: TrainedPolicy | None = None, *,
               output_dir: Path | None = None) -> tuple[Run, Path]:
    """A queued run for `job` in the registry and the folder its results go to (`output_dir`, by default
    `outputs/evals/<env>--<model or policy>/<run id>/`)."""
    from prime_lab.evals.evaluation import default_output_dir

    settings = job.to_json()
    model_name = base_model(job, policy)
    run = RunRegistry().create("eval", config_text=json.dumps(settings, indent=2), resolved=settings,
                               name=f"eval {job.env_id}", model=model_name, envs=[job.env_id])
    out = output_dir or default_output_dir(job.env_id, policy.name if policy is not None else model_name, run.id)
    run.update_status(output_dir=str(out.resolve()), **({"adapter": policy.name} if policy is not None else {}))
    return run, out


def evaluate(run: Run, output_dir: Path, job: EvalJob, environment: Environment, *,
             policy: TrainedPolicy | None = None, prompt: SystemPrompt | None = None, backend: str = "builtin",
             progress: AbstractContextManager[OnProgress] | None = None, announce: Announce = print) -> EvalResult:
    """Evaluate in this process, starting the local sampler it needs; the run ends `completed`, `failed`
    (EvalLaunchError, also when every rollout failed; any other exception goes on up, the run failed with its type
    and message and its traceback in logs/eval.log: `working`) or `stopped` (RunStopped, KeyboardInterrupt).

    `progress` is entered once the sampler serves, around the rollouts; what it gives is told of each rollout done.
    """
    from prime_lab.envs.env_server import EnvironmentDown
    from prime_lab.evals.evaluation import EvalSpec, run_evaluation
    from prime_lab.inference.control import AdapterLoadError
    from prime_lab.inference.judge import JudgeUnavailable, start_for_run
    from prime_lab.inference.vllm import VLLMNotInstalledError
    from prime_lab.models import ModelNotFoundError
    from prime_lab.runs.processes import ServerStartError

    model_name = base_model(job, policy)
    what = f"{model_name} with {policy.run_id}'s {policy.source}" if policy is not None else model_name
    announce(f"Evaluation {run.id}: {job.env_id} on {what}"
             + (f", system prompt from {prompt.path}" if prompt else "") + f" -> {output_dir}")
    with working(run, "eval") as cleanup:  # an exception not named here: the run failed with its line (`working`)
        cleanup.enter_context(job.sandbox_settings(run))
        try:
            cleanup.enter_context(sampling(run))  # system metrics of this process and the sampler it starts
            cleanup.enter_context(job.judge_settings())
            start_for_run(job, run, cleanup.callback, announce, environment.judge_wiring)
            base_url, served = _endpoint(run, job, policy, backend, cleanup.callback, announce)
            records = {"base_model": policy.base_model if policy is not None else model_name,
                       "policy": policy.metadata() if policy is not None else None,
                       "system_prompt": prompt.metadata() if prompt is not None else None}
            spec = EvalSpec(env_id=job.env_id, model=served, base_url=base_url, env_args=job.env_args,
                            num_examples=job.num_examples, rollouts_per_example=job.rollouts_per_example,
                            sampling=job.sampling_args(), max_concurrent=job.max_concurrent,
                            api_key_var=job.api_key_var if job.base_url else None, seed=job.seed,
                            system_prompt=prompt.text if prompt is not None else None, metadata=records,
                            model_source=str(records["base_model"]),
                            tools_in_system_prompt=job.tools_in_system_prompt)
            run.set_state("running", source="eval")
            with progress if progress is not None else contextlib.nullcontext() as on_progress:
                result = run_evaluation(spec, output_dir, run=run, env=environment, on_progress=on_progress,
                                        announce=announce)
        except EnvironmentDown as exc:  # its server died more often than it may be restarted: one line, no trace
            raise _failed(run, exc.line()) from None
        except (ModelNotFoundError, JudgeUnavailable) as exc:
            raise _failed(run, str(exc)) from None
        except (ServerStartError, VLLMNotInstalledError) as exc:
            raise _failed(run, f"the sampler did not start: {exc}",
                          f"the local sampler did not start:\n{exc}") from None
        except AdapterLoadError as exc:
            raise _failed(run, f"the sampler did not load the policy: {exc}",
                          f"the local sampler did not load {policy.run_id}'s {policy.source}:\n{exc}"
                          if policy is not None else str(exc)) from None
    if result.rollouts and result.failed == len(result.rollouts):
        raise _failed(run, every_rollout_failed(result, run.id, spec.base_url, spec.model))
    run.set_state("completed", source="eval")
    return result


def every_rollout_failed(result: EvalResult, run_id: str, base_url: str, model: str) -> str:
    """The one line of an evaluation whose every rollout failed: where they failed, blaming that side (the model
    endpoint, the environment, its scorer, the time limit), the first error, and what to do."""
    from prime_lab.evals.readiness import SIDES, WHY

    first = next((r.error for r in result.rollouts if r.error), "") or ""
    sources = result.report.error_sources
    env = result.metadata.get("env_id")
    samples = f"each rollout's error: prime eval samples {run_id}"
    hints = {"model": f"is the endpoint {base_url} up and serving model '{model}'?", "environment": samples,
             "scorer": f"fix it; {samples}",
             "timeout": f"is the endpoint {base_url} answering? a hung environment or scorer holds a rollout too"}
    if len(sources) == 1:
        side = next(iter(sources))
        where = {"model": f" at the model endpoint {base_url}",
                 "environment": f" in the environment {env} ({WHY['environment']})",
                 "scorer": f" in the scorer: a reward function of {env} raised",
                 "timeout": " past the time limit"}[side]
        hint = f"is it up and serving model '{model}'?" if side == "model" else hints[side]
    else:  # several sides (or rows that do not say): each side's count, and what to do for each
        where = f" ({result.report.failed_where()})" if sources else ""
        hints["scorer"] = samples
        hint = "; ".join(dict.fromkeys(hints[side] for side in SIDES if side in sources)) or samples
    return f"every rollout failed{where}; the first error: {first.splitlines()[0] if first else '?'} ({hint})"


def _failed(run: Run, reason: str, message: str | None = None) -> EvalLaunchError:
    """The run `failed` for `reason` (its status's words); the error says `message` (default: the reason)."""
    run.set_state("failed", source="eval", reason=reason)
    return EvalLaunchError(message or reason)


def _endpoint(run: Run, job: EvalJob, policy: TrainedPolicy | None, backend: str,
              on_exit: Callable[[Callable[[], Any]], Any], announce: Announce) -> tuple[str, str]:
    """The URL to evaluate against and the model name to ask it for: a sampler started here with the policy loaded
    or on the base model (stopped through `on_exit`), or the given endpoint."""
    from prime_lab.evals.policies import start_policy_sampler
    from prime_lab.inference.launch import start_run_sampler

    if policy is not None:
        sampler = start_policy_sampler(policy, run, backend, announce=announce)
        on_exit(sampler.stop)
        return sampler.base_url, policy.name
    if job.base_url is None:
        sampler = start_run_sampler(base_model(job, policy), run, backend, announce=announce)
        on_exit(sampler.stop)
        return sampler.base_url, sampler.model_name
    return job.base_url, base_model(job, policy)
