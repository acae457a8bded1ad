"""A GEPA run's lifecycle: its settings (from a config file or from flags, over the one set of defaults in
`gepa/config.py`), its run in the registry, the samplers it starts, the search and the run's states.

`prime gepa run` is the front end (it prints; the workbench launches that same command, `workbench/launch.py`);
`trainer/launcher.py` and `evals/launcher.py` are the RL and evaluation counterparts. Everything a user can fix
comes out as `GepaLaunchError`, the run already marked `failed` where one exists; a stop comes out as
`runs.registry.RunStopped`, the run `stopped`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_lab.gepa.config import GepaConfig, GepaEnvSection, validate_gepa_file
from prime_lab.gepa.env_adapter import Endpoint
from prime_lab.gepa.runner import GepaOutcome, GepaSettings, OnEvent, run_gepa
from prime_lab.inference.judge import JudgePlan, JudgeUnavailable, applied_for, start_for_run
from prime_lab.runs.registry import Run, RunRegistry, working
from prime_lab.runs.system_metrics import sampling
from prime_lab.sandbox.config import SandboxConfig, applied

Announce = Callable[[str], None]


class GepaLaunchError(Exception):
    """A problem the user can fix (a bad config, an unknown model, a sampler that did not start)."""


@dataclass
class GepaJob:
    """What a run's resolved.json holds: the search and where its models are served (None: start them here)."""

    settings: GepaSettings
    base_url: str | None = None
    reflection_base_url: str | None = None
    api_key_var: str | None = None
    sandbox: dict[str, Any] = field(default_factory=dict)  # the [sandbox] settings as given
    judge: dict[str, Any] = field(default_factory=dict)  # the [judge] settings as given (--judge MODEL, [judge])
    judge_plan: JudgePlan | None = field(default=None, repr=False)  # not recorded: made when first applied

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings.to_json(), "base_url": self.base_url,
                "reflection_base_url": self.reflection_base_url, "api_key_var": self.api_key_var,
                **({"sandbox": self.sandbox} if self.sandbox else {}), **({"judge": self.judge} if self.judge else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GepaJob:
        return cls(GepaSettings.from_json(data["settings"]), data.get("base_url"), data.get("reflection_base_url"),
                   data.get("api_key_var"), dict(data.get("sandbox") or {}), dict(data.get("judge") or {}))

    def judge_settings(self) -> AbstractContextManager[Any]:
        """Its judge's endpoint in this process's environment for a block (inference/judge.py): the environment
        loaded in it is wired to the judge, which `search` starts. Raises JudgeUnavailable."""
        return applied_for(self)

    def sandbox_settings(self, run: Run | None = None) -> AbstractContextManager[None]:
        """Its `[sandbox]` settings (and its run) for the environment this process loads and the server it starts,
        for the time of a block (sandbox/config.py)."""
        return applied(SandboxConfig.model_validate(self.sandbox), run.dir if run is not None else None)


def job_from_config(cfg: GepaConfig) -> GepaJob:
    g = cfg.gepa
    settings = GepaSettings(env_id=cfg.env.id, env_args=cfg.env.args, model=cfg.model,
                            reflection_model=cfg.reflection_model, max_metric_calls=g.max_calls,
                            num_train=g.num_train, num_val=g.num_val, num_test=g.num_test,
                            minibatch_size=g.minibatch_size, perfect_score=g.perfect_score,
                            state_columns=g.state_columns, seed=g.seed, max_concurrent=g.max_concurrent,
                            num_parallel_proposals=g.num_parallel_proposals,
                            reflection_temperature=g.reflection_temperature, use_merge=g.use_merge,
                            max_merge_invocations=g.max_merge_invocations, sampling=cfg.sampling)
    return GepaJob(settings, cfg.base_url, cfg.reflection_base_url, cfg.api_key_var,
                   cfg.sandbox.model_dump(exclude_unset=True),
                   cfg.judge.model_dump(exclude_unset=True) if cfg.judge is not None else {})


def job_for_env(env_id: str) -> GepaJob:
    """The defaults for `prime gepa run ENV` (what an empty config file naming ENV gives)."""
    return job_from_config(GepaConfig(env=GepaEnvSection(id=env_id)))


def read_config(path: Path) -> tuple[GepaJob, str]:
    """The job a config file describes and the file's text; GepaLaunchError lists every problem (file:line)."""
    result = validate_gepa_file(path)
    if not result.ok or result.config is None:
        raise GepaLaunchError("\n".join([f"Invalid config in {path}:", *(f"  • {p.format()}"
                                                                        for p in result.problems)]))
    return job_from_config(result.config), path.read_text(encoding="utf-8-sig")


def create_run(job: GepaJob, *, config_text: str = "", output_dir: Path | None = None) -> Run:
    """A queued run for `job` in the registry (in `output_dir` when given), once its environment loads."""
    from prime_lab.envs import EnvironmentLoadError, load_environment

    spec = job.settings
    try:
        # [sandbox] provider: which prime_sandboxes the environment imports; the judge it is wired to
        with job.sandbox_settings(), job.judge_settings():
            load_environment(spec.env_id, **spec.env_args)
    except (EnvironmentLoadError, JudgeUnavailable) as exc:
        raise GepaLaunchError(str(exc)) from None
    resolved = job.to_json()
    registry = RunRegistry(output_dir.parent) if output_dir is not None else RunRegistry()
    return registry.create("gepa", config_text=config_text or json.dumps(resolved, indent=2), resolved=resolved,
                           name=f"gepa {spec.env_id}", model=spec.model, envs=[spec.env_id],
                           run_id=output_dir.name if output_dir is not None else None)


def open_run(run_dir: Path) -> tuple[Run, GepaJob]:
    """An interrupted GEPA run to continue (`--resume`)."""
    run = Run(run_dir)
    try:
        return run, GepaJob.from_json(json.loads(run.resolved_path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        raise GepaLaunchError(f"{run_dir} is not a GEPA run directory (no readable resolved.json)") from None


def search(run: Run, job: GepaJob, *, backend: str = "builtin", on_event: OnEvent | None = None,
           announce: Announce = print) -> GepaOutcome:
    """Run (or continue) the search in this process, starting the local samplers it needs; the run ends
    `completed`, `failed` (GepaLaunchError; any other exception goes on up, the run failed with its type and message
    and its traceback in logs/gepa.log: `working`) or `stopped` (RunStopped, KeyboardInterrupt)."""
    from openai import APIError

    from prime_lab.envs import EnvironmentLoadError
    from prime_lab.envs.env_server import EnvironmentDown
    from prime_lab.inference.vllm import VLLMNotInstalledError
    from prime_lab.models import ModelNotFoundError
    from prime_lab.runs.processes import ServerStartError

    spec = job.settings
    announce(f"GEPA {run.id}: {spec.env_id} on {spec.model} (budget {spec.max_metric_calls} calls) -> {run.dir}")
    with working(run, "gepa") as cleanup:
        cleanup.enter_context(sampling(run))  # system metrics of this process and the samplers it starts
        cleanup.enter_context(job.sandbox_settings(run))
        try:
            cleanup.enter_context(job.judge_settings())
            start_for_run(job, run, cleanup.callback, announce)
            task, reflection = _endpoints(run, job, backend, cleanup.callback, announce)
            run.set_state("running", source="gepa")
            outcome = run_gepa(spec, task, reflection, run.gepa_dir, run=run, on_event=on_event, announce=announce)
        except (ServerStartError, VLLMNotInstalledError) as exc:
            raise _failed(run, f"the local sampler did not start: {exc}") from None
        except EnvironmentDown as exc:  # its server died more often than it may be restarted: one line, no trace
            raise _failed(run, exc.line()) from None
        except (ModelNotFoundError, EnvironmentLoadError, ValueError, JudgeUnavailable) as exc:
            raise _failed(run, str(exc)) from None
        except APIError as exc:  # the reflection model's endpoint (a task rollout's error only scores 0)
            where = job.reflection_base_url or job.base_url or "the local sampler"
            raise _failed(run, f"the model endpoint failed: {exc}",
                          f" (is {where} up and serving '{spec.reflection_model or spec.model}'?)") from None
    run.set_state("completed", source="gepa")
    return outcome


def _failed(run: Run, reason: str, hint: str = "") -> GepaLaunchError:
    run.set_state("failed", source="gepa", reason=reason)
    return GepaLaunchError(reason + hint)


def _endpoints(run: Run, job: GepaJob, backend: str, on_exit: Callable[[Callable[[], Any]], Any],
               announce: Announce) -> tuple[Endpoint, Endpoint]:
    """The task model's endpoint and the reflection model's: the given URLs, or samplers started here (one when
    both are the same model), each stopped through `on_exit`."""
    from prime_lab.inference.launch import start_run_sampler

    spec = job.settings
    reflection_name = spec.reflection_model or spec.model
    api_key = os.environ.get(job.api_key_var or "OPENAI_API_KEY", "")

    def local(model: str, role: str) -> Endpoint:
        sampler = start_run_sampler(model, run, backend, role=role, announce=announce)
        on_exit(sampler.stop)
        return Endpoint(sampler.base_url, sampler.model_name)

    if job.base_url:
        return (Endpoint(job.base_url, spec.model, api_key),
                Endpoint(job.reflection_base_url or job.base_url, reflection_name, api_key))
    task = local(spec.model, "inference")
    if reflection_name == spec.model:
        return task, task
    if job.reflection_base_url:
        return task, Endpoint(job.reflection_base_url, reflection_name, api_key)
    return task, local(reflection_name, "reflection")
