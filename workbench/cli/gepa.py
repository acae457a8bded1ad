"""`prime gepa run ENV|@CONFIG.toml`: GEPA prompt optimization, headless, as a run in the registry."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from prime_lab.workbench.cli.common import config_path, err, fail, start_local_sampler
from prime_lab.workbench.cli.eval import _json_arg

gepa_app = typer.Typer(help="GEPA prompt optimization.", no_args_is_help=True)

FLAG_DEFAULTS: dict[str, Any] = {"max_metric_calls": 500, "num_train": 100, "num_val": 50, "minibatch_size": 3,
                                 "num_test": 0, "seed": 0, "max_concurrent": 32, "num_parallel_proposals": 8}


class _Stopped(Exception):
    pass


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped()


@gepa_app.command("run")
def run(
    env: str | None = typer.Argument(None, help="Environment id, or @gepa.toml (see configs/gepa/)."),
    model: str | None = typer.Option(None, "-m", "--model", help="Task model (default smollm2-135m, local)."),
    reflection_model: str | None = typer.Option(None, "-M", "--reflection-model",
                                                help="Proposes new prompts (default: the model)."),
    max_calls: int | None = typer.Option(None, "-B", "--max-calls", min=1, help="Metric-call budget [500]."),
    num_train: int | None = typer.Option(None, "-n", "--num-train", min=1, help="Training examples [100]."),
    num_val: int | None = typer.Option(None, "-N", "--num-val", min=1, help="Validation examples [50]."),
    minibatch_size: int | None = typer.Option(None, "--minibatch-size", min=1, help="Examples per reflection [3]."),
    perfect_score: float | None = typer.Option(None, "--perfect-score", help="Skip minibatches scoring this."),
    state_columns: list[str] = typer.Option([], "--state-columns", help="State fields for reflection (repeat)."),
    env_args: str | None = typer.Option(None, "-a", "--env-args", help="load_environment() args as JSON."),
    sampling_args: str | None = typer.Option(None, "-S", "--sampling-args", help="Sampling args as JSON."),
    max_tokens: int | None = typer.Option(None, "-t", "--max-tokens", min=1, help="Max tokens per turn."),
    temperature: float | None = typer.Option(None, "-T", "--temperature", min=0.0, help="Sampling temperature."),
    concurrency: int | None = typer.Option(None, "-c", "--max-concurrent", min=1, help="Rollouts at once [32]."),
    parallel: int | None = typer.Option(None, "-P", "--num-parallel-proposals", min=1,
                                        help="Reflective proposals run at once [8]; 1 runs them one by one."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the split, minibatches, selection [0]."),
    output_dir: Path | None = typer.Option(None, "-o", "--output-dir", help="Put the run directory here."),
    base_url: str | None = typer.Option(None, "-b", "--api-base-url", help="OpenAI-compatible endpoint."),
    api_key_var: str | None = typer.Option(None, "-k", "--api-key-var", help="Env var with the API key."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the interrupted run in RUN_DIR."),
    test: int | None = typer.Option(None, "--test", min=0, help="Score seed and best on N held-out examples."),
    use_merge: bool = typer.Option(False, "--use-merge", help="Also merge candidates from different branches."),
    backend: str = typer.Option("builtin", "--backend", help="Local sampler when no -b: builtin or vllm."),
) -> None:
    """Optimize ENV's system prompt: best_prompt.txt, pareto_frontier.jsonl, metadata.json in the run."""
    from prime_lab.lab.runs import Run

    if resume is not None:
        if env is not None:
            fail("give either ENV/@CONFIG or --resume RUN_DIR, not both")
        target = Run(resume)
        if not target.resolved_path.exists():
            fail(f"{resume} is not a GEPA run directory (no resolved.json)")
        resolved = json.loads(target.resolved_path.read_text())
        _search(target, resolved, backend=backend)
        return
    if env is None:
        fail("give an environment id or @config.toml (or --resume RUN_DIR)")
    flags = {"model": model, "reflection_model": reflection_model, "max_metric_calls": max_calls,
             "num_train": num_train, "num_val": num_val, "minibatch_size": minibatch_size,
             "perfect_score": perfect_score, "state_columns": state_columns or None,
             "env_args": _json_arg(env_args, "-a/--env-args") or None,
             "sampling": _json_arg(sampling_args, "-S/--sampling-args") or None, "max_concurrent": concurrency,
             "num_parallel_proposals": parallel,
             "seed": seed, "num_test": test, "use_merge": use_merge or None}
    endpoints = {"base_url": base_url, "reflection_base_url": None, "api_key_var": api_key_var}
    if env.startswith("@") or env.endswith(".toml"):
        settings, file_endpoints, config_text = _from_toml(config_path(env))
        endpoints = {k: endpoints[k] or file_endpoints[k] for k in endpoints}
    else:
        settings, config_text = {"env_id": env}, ""
    settings.update({k: v for k, v in flags.items() if v is not None})
    # -t/-T set one key each of the sampling args, over [sampling] or -S (as in `prime eval run`)
    overrides = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature)) if v is not None}
    if overrides:
        settings["sampling"] = {**(settings.get("sampling") or {}), **overrides}
    for key, value in FLAG_DEFAULTS.items():
        settings.setdefault(key, value)
    settings.setdefault("model", "smollm2-135m")
    from prime_lab.gepa.runner import GepaSettings
    from prime_lab.lab.envs import EnvironmentLoadError, load_environment
    from prime_lab.lab.runs import RunRegistry

    spec = GepaSettings.from_json(settings)
    try:
        load_environment(spec.env_id, **spec.env_args)
    except EnvironmentLoadError as exc:
        fail(str(exc))
    resolved = {"settings": spec.to_json(), **endpoints}
    registry = RunRegistry(output_dir.parent) if output_dir is not None else RunRegistry()
    target = registry.create("gepa", config_text=config_text or json.dumps(resolved, indent=2), resolved=resolved,
                             name=f"gepa {spec.env_id}", model=spec.model, envs=[spec.env_id],
                             run_id=output_dir.name if output_dir is not None else None)
    _search(target, resolved, backend=backend)


def _from_toml(path: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    from prime_lab.gepa.config import validate_gepa_file

    result = validate_gepa_file(path)
    if not result.ok or result.config is None:
        err(f"Error: Invalid config in {path}:")
        for problem in result.problems:
            err(f"  • {problem.format()}")
        raise typer.Exit(1)
    cfg = result.config
    g = cfg.gepa
    settings = {"env_id": cfg.env.id, "env_args": cfg.env.args, "model": cfg.model,
                "reflection_model": cfg.reflection_model, "max_metric_calls": g.max_calls,
                "num_train": g.num_train, "num_val": g.num_val, "num_test": g.num_test,
                "minibatch_size": g.minibatch_size, "perfect_score": g.perfect_score,
                "state_columns": g.state_columns, "seed": g.seed, "max_concurrent": g.max_concurrent,
                "num_parallel_proposals": g.num_parallel_proposals, "reflection_temperature": g.reflection_temperature,
                "use_merge": g.use_merge, "max_merge_invocations": g.max_merge_invocations, "sampling": cfg.sampling}
    endpoints = {"base_url": cfg.base_url, "reflection_base_url": cfg.reflection_base_url,
                 "api_key_var": cfg.api_key_var}
    return settings, endpoints, path.read_text(encoding="utf-8-sig")


def _search(run: Any, resolved: dict[str, Any], *, backend: str) -> None:
    from openai import APIError

    from prime_lab.gepa.runner import GepaSettings, run_gepa
    from prime_lab.lab.envs import EnvironmentLoadError
    from prime_lab.lab.inference.process import ServerStartError
    from prime_lab.lab.inference.vllm import VLLMNotInstalledError
    from prime_lab.workbench.cli.gepa_progress import GepaProgress

    spec = GepaSettings.from_json(resolved["settings"])
    key_var = resolved.get("api_key_var") or "OPENAI_API_KEY"
    api_key = os.environ.get(key_var, "") if resolved.get("base_url") else ""
    run.register_process("gepa", os.getpid(), pgid=os.getpgid(0))
    run.set_state("starting", source="gepa")
    out = run.gepa_dir
    err(f"GEPA {run.id}: {spec.env_id} on {spec.model} (budget {spec.max_metric_calls} calls) -> {run.dir}")
    samplers: list[Any] = []
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        task, reflection = _endpoints(spec, resolved, api_key, run, backend, samplers)
        run.set_state("running", source="gepa")
        with GepaProgress(spec.max_metric_calls, enabled=sys.stderr.isatty()) as progress:
            outcome = run_gepa(spec, task, reflection, out, run=run, on_event=progress.on_event)
    except (_Stopped, KeyboardInterrupt) as exc:
        run.set_state("stopped", source="gepa", reason="stopped by the user")
        err(f"{run.id} stopped; state and outputs so far are in {out} (continue with --resume {run.dir})")
        raise typer.Exit(1 if isinstance(exc, _Stopped) else 130) from None
    except (ServerStartError, VLLMNotInstalledError) as exc:
        run.set_state("failed", source="gepa", reason=f"the sampler did not start: {exc}")
        fail(f"the local sampler did not start:\n{exc}")
    except (EnvironmentLoadError, ValueError) as exc:
        run.set_state("failed", source="gepa", reason=str(exc))
        fail(str(exc))
    except APIError as exc:  # the reflection model's endpoint (a task rollout's error only scores 0)
        reason = f"the model endpoint failed: {exc}"
        run.set_state("failed", source="gepa", reason=reason)
        where = resolved.get("reflection_base_url") or resolved.get("base_url") or "the local sampler"
        fail(f"{reason} (is {where} up and serving '{spec.reflection_model or spec.model}'?)")
    finally:
        signal.signal(signal.SIGTERM, previous)
        for sampler in samplers:
            sampler.stop()
    meta = outcome.metadata
    seed_score = outcome.state.average(0)
    typer.echo(f"candidates {meta['num_candidates']}  best #{meta['best_idx']} {meta['best_score']:.4f} "
               f"(seed {seed_score:.4f})  metric calls {meta['total_metric_calls']}/{spec.max_metric_calls}")
    if outcome.test:
        typer.echo(f"test ({spec.num_test} held-out): seed {outcome.test['seed']:.4f}  best {outcome.test['best']:.4f}")
    typer.echo(f"best prompt: {out / 'best_prompt.txt'}")
    run.set_state("completed", source="gepa")


def _endpoints(spec: Any, resolved: dict[str, Any], api_key: str, run: Any, backend: str,
               samplers: list[Any]) -> tuple[Any, Any]:
    from prime_lab.gepa.env_adapter import Endpoint

    reflection_name = spec.reflection_model or spec.model
    base_url = resolved.get("base_url")
    if base_url:
        task = Endpoint(base_url, spec.model, api_key)
        return task, Endpoint(resolved.get("reflection_base_url") or base_url, reflection_name, api_key)
    sampler = start_local_sampler(spec.model, run, backend, source="gepa")
    samplers.append(sampler)
    task = Endpoint(sampler.base_url, sampler.model_name)
    if reflection_name == spec.model:
        return task, task
    if resolved.get("reflection_base_url"):
        return task, Endpoint(resolved["reflection_base_url"], reflection_name, api_key)
    second = start_local_sampler(reflection_name, run, backend, source="gepa", role="reflection")
    samplers.append(second)
    return task, Endpoint(second.base_url, second.model_name)
