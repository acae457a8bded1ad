"""`prime gepa run ENV|@CONFIG.toml`: GEPA prompt optimization, headless, as a run in the registry; and the verbs
on GEPA runs: list, get, logs, stop, delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from prime_lab.gepa.config import GepaSearchSection
from prime_lab.models.presets import DEFAULT_MODEL
from prime_lab.workbench.cli.common import config_path, err, fail, fail_unexpected, write_new_file
from prime_lab.workbench.cli.env import INSTALL_OPTION, JUDGE_OPTION
from prime_lab.workbench.cli.eval import _json_arg, _sandbox_settings
from prime_lab.workbench.cli.render import live_output
from prime_lab.workbench.cli.run_verbs import add_run_verbs

gepa_app = typer.Typer(help="GEPA prompt optimization.", no_args_is_help=True)

_D = GepaSearchSection()  # the defaults, shown in the flags' help


@gepa_app.command("run")
def run(
    env: str | None = typer.Argument(None, help="Environment id, or @gepa.toml (see configs/gepa/)."),
    model: str | None = typer.Option(None, "-m", "--model", help=f"Task model (default {DEFAULT_MODEL}, local)."),
    reflection_model: str | None = typer.Option(None, "-M", "--reflection-model",
                                                help="Proposes new prompts (default: the model)."),
    max_calls: int | None = typer.Option(None, "-B", "--max-calls", min=1,
                                         help=f"Metric-call budget [{_D.max_calls}]."),
    num_train: int | None = typer.Option(None, "-n", "--num-train", min=1,
                                         help=f"Training examples [{_D.num_train}]."),
    num_val: int | None = typer.Option(None, "-N", "--num-val", min=1, help=f"Validation examples [{_D.num_val}]."),
    minibatch_size: int | None = typer.Option(None, "--minibatch-size", min=1,
                                              help=f"Examples per reflection [{_D.minibatch_size}]."),
    perfect_score: float | None = typer.Option(None, "--perfect-score", help="Skip minibatches scoring this."),
    state_columns: list[str] = typer.Option([], "--state-columns", help="State fields for reflection (repeat)."),
    env_args: str | None = typer.Option(None, "-a", "--env-args", help="load_environment() args as JSON."),
    sampling_args: str | None = typer.Option(None, "-S", "--sampling-args", help="Sampling args as JSON."),
    sandbox: str | None = typer.Option(None, "--sandbox", metavar="JSON",
                                       help='[sandbox] settings as JSON, e.g. \'{"network": true}\'.'),
    max_tokens: int | None = typer.Option(None, "-t", "--max-tokens", min=1, help="Max tokens per turn."),
    temperature: float | None = typer.Option(None, "-T", "--temperature", min=0.0, help="Sampling temperature."),
    concurrency: int | None = typer.Option(None, "-c", "--max-concurrent", min=1,
                                           help=f"Rollouts at once [{_D.max_concurrent}]."),
    parallel: int | None = typer.Option(None, "-P", "--num-parallel-proposals", min=1,
                                        help=f"Reflective proposals run at once [{_D.num_parallel_proposals}]; "
                                             "1 runs them one by one."),
    seed: int | None = typer.Option(None, "--seed", help=f"Seed of the split, minibatches, selection [{_D.seed}]."),
    output_dir: Path | None = typer.Option(None, "-o", "--output-dir", help="Put the run directory here."),
    base_url: str | None = typer.Option(None, "-b", "--api-base-url", help="OpenAI-compatible endpoint."),
    api_key_var: str | None = typer.Option(None, "-k", "--api-key-var", help="Env var with the API key."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the interrupted run in RUN_DIR."),
    test: int | None = typer.Option(None, "--test", min=0, help="Score seed and best on N held-out examples."),
    use_merge: bool = typer.Option(False, "--use-merge", help="Also merge candidates from different branches."),
    backend: str = typer.Option("builtin", "--backend", help="Local sampler when no -b: builtin or vllm."),
    install: bool = INSTALL_OPTION,
    judge: str | None = JUDGE_OPTION,
) -> None:
    """Optimize ENV's system prompt: best_prompt.txt, pareto_frontier.jsonl, metadata.json, proposals.jsonl (every
    proposal, accepted or not) in the run."""
    from prime_lab.gepa import launcher
    from prime_lab.inference.judge import settings_for
    from prime_lab.workbench.cli.env import install_missing
    from prime_lab.workbench.cli.secret import inject_secrets

    try:
        if resume is not None:
            if env is not None:
                fail("give either ENV/@CONFIG or --resume RUN_DIR, not both")
            target, job = launcher.open_run(resume)
            inject_secrets([job.settings.env_id])  # `prime secret`: under the shell's variables
        elif env is None:
            fail("give an environment id or @config.toml (or --resume RUN_DIR)")
        else:
            if env.startswith("@") or env.endswith(".toml"):
                job, config_text = launcher.read_config(config_path(env))
            else:
                job, config_text = launcher.job_for_env(env), ""
            flags = {"model": model, "reflection_model": reflection_model, "max_metric_calls": max_calls,
                     "num_train": num_train, "num_val": num_val, "minibatch_size": minibatch_size,
                     "perfect_score": perfect_score, "state_columns": state_columns or None,
                     "env_args": _json_arg(env_args, "-a/--env-args") or None,
                     "sampling": _json_arg(sampling_args, "-S/--sampling-args") or None,
                     "max_concurrent": concurrency, "num_parallel_proposals": parallel, "seed": seed,
                     "num_test": test, "use_merge": use_merge or None}
            for key, value in flags.items():  # flags over the file (or the defaults)
                if value is not None:
                    setattr(job.settings, key, value)
            # -t/-T set one key each of the sampling args, over [sampling] or -S (as in `prime eval run`)
            job.settings.sampling.update({k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature))
                                          if v is not None})
            job.sandbox = _sandbox_settings({**job.sandbox, **_json_arg(sandbox, "--sandbox")})
            job.judge = settings_for(judge, job.judge)
            job.base_url = base_url or job.base_url
            job.api_key_var = api_key_var or job.api_key_var
            if install:
                install_missing([job.settings.env_id])
            inject_secrets([job.settings.env_id])
            _obtain_models(job)
            target = launcher.create_run(job, config_text=config_text, output_dir=output_dir)
        _search(target, job, backend)
    except launcher.GepaLaunchError as exc:
        fail(str(exc))


def _obtain_models(job: Any) -> None:
    """The task and reflection models this command serves locally, built or downloaded before the run is registered
    (workbench/cli/models.py `obtain`); none for a model reached through -b/--base-url."""
    from prime_lab.workbench.cli.models import obtain, obtain_judge

    obtain_judge(job.judge)
    if job.base_url:
        return
    spec = job.settings
    obtain(spec.model)
    reflection = spec.reflection_model or spec.model
    if reflection != spec.model and not job.reflection_base_url:
        obtain(reflection, "reflection model")


def _search(run: Any, job: Any, backend: str) -> None:
    from prime_lab.gepa.launcher import GepaLaunchError, search
    from prime_lab.runs.registry import RunStopped
    from prime_lab.workbench.cli.gepa_progress import GepaProgress

    spec = job.settings
    out = run.gepa_dir
    try:
        with GepaProgress(spec.max_metric_calls, enabled=live_output()) as progress:
            outcome = search(run, job, backend=backend, on_event=progress.on_event, announce=err)
    except (RunStopped, KeyboardInterrupt) as exc:
        err(f"{run.id} stopped; state and outputs so far are in {out} (continue with --resume {run.dir})")
        raise typer.Exit(1 if isinstance(exc, RunStopped) else 130) from None
    except GepaLaunchError:
        raise
    except Exception as exc:  # unexpected: one line; the run failed, the traceback in its log
        fail_unexpected(run, "gepa", exc)
    meta = outcome.metadata
    seed_score = outcome.state.average(0)
    typer.echo(f"candidates {meta['num_candidates']}  best #{meta['best_idx']} {meta['best_score']:.4f} "
               f"(seed {seed_score:.4f})  metric calls {meta['total_metric_calls']}/{spec.max_metric_calls}")
    if outcome.test:
        typer.echo(f"test ({spec.num_test} held-out): seed {outcome.test['seed']:.4f}  best {outcome.test['best']:.4f}")
    typer.echo(f"best prompt: {out / 'best_prompt.txt'}  (every proposal: {out / 'proposals.jsonl'})")
    if outcome.note:  # the last line: no candidate beat the seed, and what to change
        typer.echo(outcome.note)


# After `run` in the help: the verbs on GEPA runs (an RL run's or an evaluation's id is an error naming its command).
@gepa_app.command("export")
def export(
    run_id: str = typer.Argument(..., help="A GEPA run id (or a unique prefix)."),
    rl: bool = typer.Option(False, "--rl", help="An RL config whose environment starts from the best prompt."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write it here (default: print it)."),
    max_steps: int = typer.Option(30, "--max-steps", min=1, help="The RL run's steps."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite an existing file."),
) -> None:
    """A GEPA run's best prompt as the start of what comes next: `--rl`, an RL config (validated)."""
    from prime_lab.envs import EnvironmentLoadError
    from prime_lab.gepa.export import (
        ExportError,
        GepaResult,
        prompt_route,
        rl_config,
        seed_warning,
        takes_system_prompt,
    )
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer.config import validate_rl_config

    if not rl:
        fail("say what to export: --rl (an RL config starting from the best prompt)")
    try:
        result = GepaResult.of(RunRegistry().get(run_id))
        through_args = takes_system_prompt(result.env_id)
    except (ExportError, EnvironmentLoadError) as exc:
        fail(str(exc))
    text = rl_config(result, through_args=through_args, max_steps=max_steps)
    checked = validate_rl_config(text, str(output or "<exported>"))
    if not checked.ok:  # a bug of ours, or a model GEPA reached only through an endpoint
        fail("the exported config does not validate:\n" + "\n".join(p.format() for p in checked.errors))
    how = prompt_route(result.env_id, through_args)
    warning = seed_warning(result)
    if warning:
        err(warning)
    if output is None:
        typer.echo(text, nl=False)
        err(how)
        return
    write_new_file(text, output, force)
    err(f"Wrote {output}: {how}.\n  run:  prime rl run @{output}\n  edit: prime lab {output}")


add_run_verbs(gepa_app, kind="gepa")
