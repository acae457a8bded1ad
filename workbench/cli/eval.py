"""`prime eval run`: evaluate a model on an environment (vf-eval's flags), as a run in the registry, the base model
or a trained run's policy (`--adapter RUN[:STEP]`), with the environment's system prompt or another
(`--system-prompt-file`); `prime eval compare`: evaluations side by side, with a paired bootstrap interval for each
difference; and the verbs on evaluations: list, get (with the readiness verdict), samples (headed by what its
means are of), logs, stop, delete."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prime_lab.models.presets import DEFAULT_MODEL
from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import (
    OUTPUT_OPTION,
    OutputFormat,
    config_path,
    err,
    fail,
    fail_unexpected,
    print_json,
)
from prime_lab.workbench.cli.env import INSTALL_OPTION, JUDGE_OPTION, install_missing
from prime_lab.workbench.cli.render import live_output, print_table, progress_console
from prime_lab.workbench.cli.run_verbs import add_run_verbs

if TYPE_CHECKING:
    from prime_lab.envs import Environment, Rollout
    from prime_lab.evals.compare import Comparison
    from prime_lab.evals.evaluation import EvalResult, SystemPrompt
    from prime_lab.evals.launcher import EvalJob, OnProgress
    from prime_lab.evals.policies import TrainedPolicy
    from prime_lab.evals.readiness import Readiness
    from prime_lab.runs.registry import Run

eval_app = typer.Typer(help="Evaluate models on environments.", no_args_is_help=True)


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


@eval_app.command("run")
def run(
    env: str = typer.Argument(..., help="Environment id (owner/name or a built-in name), or @eval.toml."),
    model: str | None = typer.Option(None, "-m", "--model", help=f"Model (default: {DEFAULT_MODEL}, served locally)."),
    num_examples: int = typer.Option(5, "-n", "--num-examples", help="Examples (-1 = all)."),
    rollouts: int = typer.Option(3, "-r", "--rollouts-per-example", min=1, help="Rollouts per example."),
    env_args: str | None = typer.Option(None, "-a", "--env-args", help="load_environment() args as JSON."),
    sampling_args: str | None = typer.Option(None, "-S", "--sampling-args", help="Sampling args as JSON."),
    sandbox: str | None = typer.Option(None, "--sandbox", metavar="JSON",
                                       help='[sandbox] settings as JSON, e.g. \'{"network": true}\' (sandboxed code: '
                                            'provider, network, isolation, memory_gb, timeout).'),
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
    install: bool = INSTALL_OPTION,
    judge: str | None = JUDGE_OPTION,
) -> None:
    """Evaluate MODEL on ENV: results.jsonl, metadata.json, and a readiness verdict for RL."""
    from prime_lab.envs import EnvironmentLoadError, MissingKeyError, load_env_files, load_environment
    from prime_lab.evals import launcher
    from prime_lab.inference.judge import JudgeUnavailable, settings_for
    from prime_lab.workbench.cli.models import obtain, obtain_judge
    from prime_lab.workbench.cli.secret import inject_secrets

    given_env_args = _json_arg(env_args, "-a/--env-args")
    given_sampling = _json_arg(sampling_args, "-S/--sampling-args")
    given_sandbox = _json_arg(sandbox, "--sandbox")
    if env.startswith("@") or env.endswith(".toml"):
        # the file's settings; --adapter and --system-prompt-file given on the command line win over its own
        job = _read_config(config_path(env))
        job.adapter = adapter or job.adapter
        job.system_prompt_file = system_prompt_file or job.system_prompt_file
    else:
        job = launcher.EvalJob(env_id=env, model=model, env_args=given_env_args, num_examples=num_examples,
                               rollouts_per_example=rollouts, sampling=given_sampling, base_url=base_url,
                               adapter=adapter, system_prompt_file=system_prompt_file)
    job.max_tokens, job.temperature, job.max_concurrent = max_tokens, temperature, concurrency
    job.api_key_var, job.seed = api_key_var, seed
    job.sandbox = _sandbox_settings({**job.sandbox, **given_sandbox})
    job.judge = settings_for(judge, job.judge)
    if num_examples == 0 or num_examples < -1:
        fail("-n/--num-examples must be -1 (all) or at least 1")
    if backend not in ("builtin", "vllm"):
        fail("--backend must be builtin or vllm")
    try:
        policy, prompt = launcher.trained_policy(job), launcher.system_prompt(job)
    except launcher.EvalLaunchError as exc:
        fail(str(exc))
    if install:
        install_missing([job.env_id])
    try:
        load_env_files(env_file)
        inject_secrets([job.env_id])  # `prime secret`: under the shell's variables and --env-file's
        # [sandbox] provider: which prime_sandboxes the environment imports; the judge it is wired to
        with job.sandbox_settings(), job.judge_settings():
            environment = load_environment(job.env_id, **job.env_args)
    except (EnvironmentLoadError, MissingKeyError, JudgeUnavailable) as exc:
        fail(str(exc))
    if job.model and job.base_url is None and policy is None:
        obtain(job.model)  # built or downloaded here, before the run is registered (its sampler then finds it)
    obtain_judge(job.judge)
    _evaluate(job, environment, policy=policy, prompt=prompt, output_dir=output_dir, backend=backend, verbose=verbose)


def _sandbox_settings(given: dict[str, Any]) -> dict[str, Any]:
    """`--sandbox` over the file's [sandbox], checked as a [sandbox] table (one line where it is not one)."""
    from prime_lab.sandbox.config import parse

    try:
        parse(given, "--sandbox")
    except ValueError as exc:
        fail(str(exc))
    return given


def _read_config(path: Path) -> EvalJob:
    from prime_lab.evals.launcher import EvalConfigError, read_config

    try:
        return read_config(path)
    except EvalConfigError as exc:
        for problem in exc.problems:
            err(problem.format())
        fail(str(exc))


def _evaluate(job: EvalJob, environment: Environment, *, policy: TrainedPolicy | None, prompt: SystemPrompt | None,
              output_dir: Path | None, backend: str, verbose: bool) -> None:
    from prime_lab.evals.launcher import EvalLaunchError, create_run, evaluate
    from prime_lab.runs.registry import RunStopped

    target, out = create_run(job, policy, output_dir=output_dir)
    try:
        result = evaluate(target, out, job, environment, policy=policy, prompt=prompt, backend=backend,
                          progress=_progress_bar(verbose), announce=err)
    except RunStopped:
        err(f"{target.id} stopped; results so far are in {out}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err(f"{target.id} interrupted; results so far are in {out}")
        raise typer.Exit(130) from None
    except EvalLaunchError as exc:
        fail(str(exc))
    except Exception as exc:  # unexpected: one line; the run failed, the traceback in its log
        fail_unexpected(target, "eval", exc)
    _summarise(result)


@contextmanager
def _progress_bar(verbose: bool) -> Iterator[OnProgress]:
    """A bar of the rollouts done and their average reward (on a terminal); -v prints each rollout's reward too."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("avg reward {task.fields[avg]:.3f}"), TimeElapsedColumn())
    with Progress(*columns, transient=False, disable=not live_output(), console=progress_console()) as progress:
        task = progress.add_task("rollouts", total=None, avg=0.0)
        rewards: list[float] = []

        def on_progress(done: int, total: int, rollout: Rollout) -> None:
            rewards.append(rollout.reward)
            progress.update(task, completed=done, total=total, avg=sum(rewards) / len(rewards))
            if verbose:
                err(f"[{done}/{total}] example {rollout.example_id}: reward {rollout.reward:.3f}"
                    + (f"  error: {rollout.error.splitlines()[0]}" if rollout.error else ""))

        yield on_progress


def _summarise(result: EvalResult) -> None:
    stats = result.report
    meta = result.metadata
    typer.echo(f"env {meta['env_id']}  model {meta['model']}  examples {meta['num_examples']} x "
               f"{meta['rollouts_per_example']} rollouts  {meta['time_ms'] / 1000:.1f} s")
    typer.echo(f"avg reward {stats.avg_reward:.3f} (the mean of all {stats.rollouts} rollouts)"
               + "".join(f"  {k} {v:.3f}" for k, v in meta["avg_metrics"].items()))
    typer.echo(f"per-example reward std {stats.mean_example_std:.3f}; zero-variance examples "
               f"{stats.zero_variance_share:.0%}; errors {result.failed}")
    typer.echo("\n".join(result.readiness.lines()))
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


# `get` and `samples` ---------------------------------------------------------------------------------------------
def _verdict(run: Run) -> tuple[Readiness | None, str]:
    """An evaluation's readiness verdict (None, with why, while it has none: not finished, no results)."""
    from prime_lab.evals.readiness import ReadinessError, read_readiness

    output_dir = run.read_status().get("output_dir")
    if not output_dir:
        return None, "no results yet"
    try:
        return read_readiness(Path(output_dir)), ""
    except ReadinessError as exc:
        return None, str(exc)


def get(ctx: typer.Context, run_id: str = run_views.RUN_ID, output: OutputFormat = OUTPUT_OPTION) -> None:
    """An evaluation's facts (id, state, model, times, where its files are) and its readiness verdict for RL."""
    run = run_views.find_run(ctx, run_id)
    readiness, why = _verdict(run)
    if output is OutputFormat.json:
        print_json({**run_views.run_facts(run), "readiness": readiness.to_dict() if readiness else None})
        return
    run_views.get(ctx, run.id, output)
    typer.echo("")
    typer.echo("\n".join(readiness.lines()) if readiness else f"verdict: none yet ({why})")


def samples(
    ctx: typer.Context,
    run_id: str = run_views.RUN_ID,
    num: int | None = typer.Option(None, "-n", "--num", min=1, help="Only the first N rollouts."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """An evaluation's rollouts, as far as it got, under the reward mean of those shown and of the evaluation."""
    from prime_lab.workbench.dashboards.files import read_jsonl_from

    run = run_views.find_run(ctx, run_id)
    status = run.read_status()
    results = Path(status["output_dir"]) / "results.jsonl" if status.get("output_dir") else None
    if results is None or not results.is_file():
        fail(f"{run.id} has no results yet" + (f" ({results})" if results is not None else ""))
    rows, _ = read_jsonl_from(results, 0)
    shown = rows[:num] if num is not None else rows
    if output is OutputFormat.json:
        print_json(shown)
        return
    envs = ", ".join(status.get("envs") or []) or "-"
    text = run_views.rollouts_text("", shown)
    body = text.split("\n", 1)[1] if "\n" in text else ""  # the rollouts, under a header of our own
    typer.echo(f"{run.id} · {envs} on {status.get('model') or '-'} · {_samples_header(shown, rows, results.parent)}"
               + (f"\n{body}" if body else ""))
    if len(shown) < len(rows):
        err(f"({len(shown)} of {len(rows)} rollouts shown; without -n all of them)")


def _samples_header(shown: list[dict[str, Any]], rows: list[dict[str, Any]], folder: Path) -> str:
    """What the rewards' means are of: of the rollouts shown, and (when those are not all) of the evaluation, over
    all its rollouts (metadata.json's once it finished, else those in results.jsonl so far)."""
    def rewards(of: list[dict[str, Any]]) -> list[float]:
        return [float(r["reward"]) for r in of if isinstance(r.get("reward"), int | float)]

    mine, every = rewards(shown), rewards(rows)
    count = f"{len(shown)} rollout{'s' * (len(shown) != 1)}"
    if not mine:
        return f"{count}, none scored"
    try:
        finished = json.loads((folder / "metadata.json").read_text()).get("avg_reward")
    except (OSError, ValueError, AttributeError):
        finished = None
    done = isinstance(finished, int | float)
    spread = f"(min {min(mine):.3f}, max {max(mine):.3f})"
    if len(shown) == len(rows):
        of = f"all {len(mine)}" if done else f"the {len(mine)} so far"
        return f"{count} · reward mean of {of}: {sum(mine) / len(mine):.3f} {spread}"
    whole = f"evaluation: {finished:.3f} over {len(every)} rollouts" if done else \
        f"evaluation so far: {sum(every) / len(every):.3f} over {len(every)} rollouts"
    return (f"{len(shown)} of {len(rows)} rollouts · reward mean of the {len(mine)} shown: "
            f"{sum(mine) / len(mine):.3f} {spread}; {whole}")


# After `run` and `compare` in the help: the verbs on evaluations (an RL or GEPA run's id is an error naming its
# own command). `get` is this group's own (the shared one, with the readiness verdict): registered after the
# shared verbs, it takes their `get`'s place (a Typer group keeps the last command of a name).
add_run_verbs(eval_app, kind="eval")
eval_app.command("get")(get)
eval_app.command("samples")(samples)
