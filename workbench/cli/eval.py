"""`prime eval run`: evaluate a model on an environment (vf-eval's flags), as a run in the registry, the base model
or a trained run's policy (`--adapter RUN[:STEP]`), with the environment's system prompt or another
(`--system-prompt-file`); `prime eval compare`: evaluations side by side, with a paired bootstrap interval for each
difference; and the verbs on evaluations: list, get, samples, logs, stop, delete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, config_path, err, fail, print_json
from prime_lab.workbench.cli.render import live_output, print_table, progress_console
from prime_lab.workbench.cli.run_verbs import add_run_verbs

if TYPE_CHECKING:
    from prime_lab.evals.compare import Comparison
    from prime_lab.evals.evaluation import SystemPrompt
    from prime_lab.evals.policies import TrainedPolicy

eval_app = typer.Typer(help="Evaluate models on environments.", no_args_is_help=True)

DEFAULT_MODEL = "smollm2-135m"


def _json_arg(value: str | None, flag: str) -> dict[str, Any]:
    if not value:
        return {}
    try:
        data = json.loads(value)
    except ValueError as exc:
        fail(f"{flag} must be a JSON object, e.g. '{{\"max_turns\": 3}}': {exc}")
    if not isinstance(data, dict):
        fail(f"{flag} must be a JSON object, not {type(data).__name__}")
    return data


def _sampling(sampling_json: dict[str, Any], max_tokens: int | None, temperature: float | None) -> Any:
    from prime_lab.envs import SamplingArgs

    known = {"max_tokens", "temperature", "top_p", "stop", "seed"}
    args = SamplingArgs(**{k: v for k, v in sampling_json.items() if k in known})
    args.extra_body = {k: v for k, v in sampling_json.items() if k not in known}
    if max_tokens is not None:
        args.max_tokens = max_tokens
    if temperature is not None:
        args.temperature = temperature
    return args


@eval_app.command("run")
def run(
    env: str = typer.Argument(..., help="Environment id (owner/name or a built-in name), or @eval.toml."),
    model: str | None = typer.Option(None, "-m", "--model", help=f"Model (default: {DEFAULT_MODEL}, served locally)."),
    num_examples: int = typer.Option(5, "-n", "--num-examples", help="Examples (-1 = all)."),
    rollouts: int = typer.Option(3, "-r", "--rollouts-per-example", min=1, help="Rollouts per example."),
    env_args: str | None = typer.Option(None, "-a", "--env-args", help="load_environment() args as JSON."),
    sampling_args: str | None = typer.Option(None, "-S", "--sampling-args", help="Sampling args as JSON."),
    concurrency: int = typer.Option(32, "-c", "--max-concurrent", min=1, help="Rollouts in flight at once."),
    base_url: str | None = typer.Option(None, "-b", "--api-base-url", help="Use this OpenAI-compatible endpoint."),
    api_key_var: str = typer.Option("OPENAI_API_KEY", "-k", "--api-key-var", help="Env var with the API key."),
    max_tokens: int | None = typer.Option(None, "-t", "--max-tokens", min=1, help="Max tokens per turn."),
    temperature: float | None = typer.Option(None, "-T", "--temperature", min=0.0, help="Sampling temperature."),
    seed: int | None = typer.Option(None, "--seed", help="Shuffle the eval examples with this seed."),
    output_dir: Path | None = typer.Option(None, "-o", "--output-dir",
                                           help="Where results go (default outputs/evals/<env>--<model>/<run>)."),
    backend: str = typer.Option("builtin", "--backend", help="Local sampler when no -b: builtin or vllm."),
    env_file: list[Path] = typer.Option([], "--env-file", help="KEY=VALUE secrets for the environment (repeatable)."),
    adapter: str | None = typer.Option(None, "--adapter", metavar="RUN[:STEP]",
                                       help="Evaluate an RL or SFT run's trained policy (default: its newest step) "
                                            "on its base model."),
    system_prompt_file: str | None = typer.Option(None, "--system-prompt-file", metavar="FILE|GEPA_RUN",
                                                  help="Replace the environment's system prompt with this file's "
                                                       "text, or a GEPA run's best prompt."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print each rollout's reward as it finishes."),
) -> None:
    """Evaluate MODEL on ENV: results.jsonl, metadata.json, and a difficulty report for RL."""
    from prime_lab.envs import EnvironmentLoadError, MissingKeyError, load_env_files, load_environment
    from prime_lab.workbench.cli.secret import inject_secrets

    settings: dict[str, Any] = {"env": env, "model": model, "num_examples": num_examples, "rollouts": rollouts,
                                "env_args": _json_arg(env_args, "-a/--env-args"),
                                "sampling": _json_arg(sampling_args, "-S/--sampling-args"),
                                "base_url": base_url, "adapter": adapter, "system_prompt_file": system_prompt_file}
    if env.startswith("@") or env.endswith(".toml"):
        settings.update(_from_toml(config_path(env), adapter=adapter, system_prompt_file=system_prompt_file))
    env_id = settings["env"]
    if num_examples == 0 or num_examples < -1:
        fail("-n/--num-examples must be -1 (all) or at least 1")
    if backend not in ("builtin", "vllm"):
        fail("--backend must be builtin or vllm")
    policy, prompt = _policy(settings), _system_prompt(settings)
    try:
        load_env_files(env_file)
        inject_secrets([env_id])  # `prime secret`: under the shell's variables and --env-file's
        environment = load_environment(env_id, **settings["env_args"])
    except (EnvironmentLoadError, MissingKeyError) as exc:
        fail(str(exc))
    model_name = settings["model"] or (policy.base_model if policy is not None else DEFAULT_MODEL)
    _evaluate(environment, env_id, model_name, settings, concurrency=concurrency, api_key_var=api_key_var,
              sampling=_sampling(settings["sampling"], max_tokens, temperature), seed=seed, output_dir=output_dir,
              backend=backend, verbose=verbose, policy=policy, prompt=prompt)


def _policy(settings: dict[str, Any]) -> TrainedPolicy | None:
    """The trained policy `--adapter` names (None without it); refuses -b and a -m other than the run's base."""
    from prime_lab.evals.policies import PolicyNotFoundError, resolve_policy

    if not settings["adapter"]:
        return None
    if settings["base_url"]:
        fail("--adapter starts a local sampler with the run's policy loaded: leave out -b (to use your own server, "
             "load the adapter there and give -b with -m ADAPTER_NAME)")
    try:
        return resolve_policy(settings["adapter"], settings["model"])
    except PolicyNotFoundError as exc:
        fail(str(exc))


def _system_prompt(settings: dict[str, Any]) -> SystemPrompt | None:
    from prime_lab.evals.evaluation import SystemPromptError, read_system_prompt

    if not settings["system_prompt_file"]:
        return None
    try:
        return read_system_prompt(settings["system_prompt_file"])
    except SystemPromptError as exc:
        fail(str(exc))


def _from_toml(path: Path, *, adapter: str | None, system_prompt_file: str | None) -> dict[str, Any]:
    """The file's settings; `--adapter` and `--system-prompt-file` given on the command line win over its own."""
    from prime_lab.evals.evaluation import EvalFileConfig, validate_eval_file

    result = validate_eval_file(path)
    for problem in result.problems:
        err(problem.format())
    if not result.ok or result.config is None:
        fail(f"invalid eval config {path}")
    cfg: EvalFileConfig = result.config
    beside = path.parent / cfg.system_prompt_file if cfg.system_prompt_file else None
    if beside is not None and beside.is_file():
        cfg.system_prompt_file = str(beside)
    return {"env": cfg.env.id, "env_args": cfg.env.args, "model": cfg.model, "num_examples": cfg.num_examples,
            "rollouts": cfg.rollouts_per_example, "sampling": cfg.sampling, "base_url": cfg.base_url,
            "adapter": adapter or cfg.adapter, "system_prompt_file": system_prompt_file or cfg.system_prompt_file}


def _evaluate(environment: Any, env_id: str, model_name: str, settings: dict[str, Any], *, concurrency: int,
              api_key_var: str, sampling: Any, seed: int | None, output_dir: Path | None, backend: str,
              verbose: bool, policy: TrainedPolicy | None = None, prompt: SystemPrompt | None = None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prime_lab.evals.evaluation import EvalSpec, default_output_dir, run_evaluation
    from prime_lab.evals.policies import start_policy_sampler
    from prime_lab.inference.launch import start_run_sampler
    from prime_lab.inference.vllm import AdapterLoadError, VLLMNotInstalledError
    from prime_lab.models import ModelNotFoundError
    from prime_lab.runs.processes import ServerStartError
    from prime_lab.runs.registry import RunRegistry, RunStopped, working

    run = RunRegistry().create("eval", config_text=json.dumps(settings, indent=2), resolved=settings,
                               name=f"eval {env_id}", model=model_name, envs=[env_id])
    evaluated = policy.name if policy is not None else model_name
    out = output_dir or default_output_dir(env_id, evaluated, run.id)
    run.update_status(output_dir=str(out.resolve()), **({"adapter": policy.name} if policy is not None else {}))
    what = f"{model_name} with {policy.run_id}'s {policy.source}" if policy is not None else model_name
    err(f"Evaluation {run.id}: {env_id} on {what}" + (f", system prompt from {prompt.path}" if prompt else "")
        + f" -> {out}")
    try:
        with working(run, "eval") as cleanup:
            base_url = settings["base_url"]
            served = model_name
            if policy is not None:
                sampler = start_policy_sampler(policy, run, backend, announce=err)
                cleanup.callback(sampler.stop)
                base_url, served = sampler.base_url, policy.name
            elif base_url is None:
                sampler = start_run_sampler(model_name, run, backend, announce=err)
                cleanup.callback(sampler.stop)
                base_url, served = sampler.base_url, sampler.model_name
            records = {"base_model": policy.base_model if policy is not None else model_name,
                       "policy": policy.metadata() if policy is not None else None,
                       "system_prompt": prompt.metadata() if prompt is not None else None}
            spec = EvalSpec(env_id=env_id, model=served, base_url=base_url, env_args=settings["env_args"],
                            num_examples=settings["num_examples"], rollouts_per_example=settings["rollouts"],
                            sampling=sampling, max_concurrent=concurrency,
                            api_key_var=api_key_var if settings["base_url"] else None, seed=seed,
                            system_prompt=prompt.text if prompt is not None else None, metadata=records)
            run.set_state("running", source="eval")
            columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("avg reward {task.fields[avg]:.3f}"), TimeElapsedColumn())
            with Progress(*columns, transient=False, disable=not live_output(),
                          console=progress_console()) as progress:
                task = progress.add_task("rollouts", total=None, avg=0.0)
                rewards: list[float] = []

                def on_progress(done: int, total: int, rollout: Any) -> None:
                    rewards.append(rollout.reward)
                    progress.update(task, completed=done, total=total, avg=sum(rewards) / len(rewards))
                    if verbose:
                        err(f"[{done}/{total}] example {rollout.example_id}: reward {rollout.reward:.3f}"
                            + (f"  error: {rollout.error.splitlines()[0]}" if rollout.error else ""))

                result = run_evaluation(spec, out, run=run, env=environment, on_progress=on_progress)
    except RunStopped:
        err(f"{run.id} stopped; results so far are in {out}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err(f"{run.id} interrupted; results so far are in {out}")
        raise typer.Exit(130) from None
    except ModelNotFoundError as exc:
        run.set_state("failed", source="eval", reason=str(exc))
        fail(str(exc))
    except (ServerStartError, VLLMNotInstalledError) as exc:
        run.set_state("failed", source="eval", reason=f"the sampler did not start: {exc}")
        fail(f"the local sampler did not start:\n{exc}")
    except AdapterLoadError as exc:
        run.set_state("failed", source="eval", reason=f"the sampler did not load the policy: {exc}")
        fail(f"the local sampler did not load {policy.run_id}'s {policy.source}:\n{exc}" if policy is not None
             else str(exc))
    if result.rollouts and result.failed == len(result.rollouts):
        first = next(r.error for r in result.rollouts if r.error)
        reason = f"every rollout failed; the first error: {(first or '').splitlines()[0]}"
        run.set_state("failed", source="eval", reason=reason)
        fail(f"{reason}\n(is the endpoint {spec.base_url} up and serving model '{spec.model}'?)")
    _summarise(result)
    run.set_state("completed", source="eval")


def _summarise(result: Any) -> None:
    report = result.report
    meta = result.metadata
    typer.echo(f"env {meta['env_id']}  model {meta['model']}  examples {meta['num_examples']} x "
               f"{meta['rollouts_per_example']} rollouts  {meta['time_ms'] / 1000:.1f} s")
    typer.echo(f"avg reward {report.avg_reward:.3f}" + "".join(f"  {k} {v:.3f}"
                                                             for k, v in meta["avg_metrics"].items()))
    typer.echo(f"per-example reward std {report.mean_example_std:.3f}; zero-variance examples "
               f"{report.zero_variance_share:.0%}; errors {result.failed}")
    typer.echo(("ready for RL: " if report.ok else "not ready for RL: ") + "; ".join(report.verdict))
    typer.echo(f"results: {result.output_dir / 'results.jsonl'}")


@eval_app.command("compare")
def compare(
    evaluations: list[str] = typer.Argument(..., metavar="EVALUATION",
                                            help="Two or more (A B [C ...]): run ids (or unique prefixes) or output "
                                                 "folders."),
    output: OutputFormat = OUTPUT_OPTION,
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap's resampling."),
    resamples: int = typer.Option(10_000, "--resamples", min=100, help="Bootstrap resamples."),
) -> None:
    """Compare evaluations of one environment against the first (A): mean rewards, each difference with a paired
    bootstrap 95% interval, per-example rewards, and the examples that changed most."""
    from prime_lab.evals.compare import ComparisonError, compare_evaluations

    if len(evaluations) < 2:
        fail("give two evaluations or more: prime eval compare A B [C ...]")
    try:
        comparison = compare_evaluations(evaluations, seed=seed, resamples=resamples)
    except ComparisonError as exc:
        fail(str(exc))
    for note in comparison.notes:
        err(f"Note: {note}")
    if output is OutputFormat.json:
        print_json(comparison.to_dict())
        return
    _print_comparison(comparison)


def _signed(value: float) -> str:
    return f"{value:+.3f}"


def _print_comparison(comparison: Comparison) -> None:
    first = comparison.evaluations[0].letter
    typer.echo(f"{comparison.env_id} · {len(comparison.examples)} examples in common · paired bootstrap "
               f"{comparison.confidence:.0%} interval, {comparison.resamples:,} resamples, seed {comparison.seed}")
    typer.echo("")
    intervals = {d.letter: f"{_signed(d.mean)} [{_signed(d.low)}, {_signed(d.high)}]" for d in comparison.differences}
    width = max(len(f"VS {first} (95% CI)"), *(len(v) for v in intervals.values()))
    typer.echo(f"   MEAN   {f'VS {first} (95% CI)':<{width}}  EVALUATION")
    for summary in comparison.evaluations:
        interval = intervals.get(summary.letter, "-")
        typer.echo(f"{summary.letter:<2} {summary.mean:.3f}  {interval:<{width}}  {summary.label}  "
                   f"({summary.run_id or summary.path})")
    typer.echo("")
    letters = [s.letter for s in comparison.evaluations]
    columns = ["EXAMPLE", *letters, *(f"{d.letter}-{first}" for d in comparison.differences), "PROMPT"]
    print_table(columns, ([row.example, *(f"{r:.3f}" for r in row.rewards),
                           *(_signed(r - row.rewards[0]) for r in row.rewards[1:]), row.prompt]
                          for row in comparison.examples))
    for d in comparison.differences:
        typer.echo("")
        verdict = ("better" if d.low > 0 else "worse") if d.significant else "no clear difference (0 in the interval)"
        typer.echo(f"{d.letter} vs {first}: {_signed(d.mean)} {verdict}; changed most:")
        if not d.changed:
            typer.echo("  no example changed")
        for change in d.changed:
            typer.echo(f"  example {change.example}: {change.before:.3f} -> {change.after:.3f} "
                       f"({_signed(change.delta)})  {change.prompt}")


# After `run` and `compare` in the help: the verbs on evaluations (an RL or GEPA run's id is an error naming its
# own command).
add_run_verbs(eval_app, kind="eval")
eval_app.command("samples")(run_views.samples)
