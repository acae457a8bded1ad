"""`prime train` (also `prime rl`): RL configs and runs, headless."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import typer

from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import (
    OUTPUT_OPTION,
    OutputFormat,
    config_path,
    err,
    fail,
    parse_duration,
    print_json,
)
from prime_lab.workbench.cli.models import models
from prime_lab.workbench.cli.render import format_event, runs_table
from prime_lab.workbench.cli.rl_run import restart, run

rl_app = typer.Typer(
    help="Reinforcement learning: write, validate, run and manage RL configs and runs.",
    no_args_is_help=True,
)
rl_app.command("models")(models)
rl_app.command("run")(run)
rl_app.command("restart")(restart)


@rl_app.command("init")
def init(
    path: Path | None = typer.Argument(None, help="Write the template here (default: print it to stdout)."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite an existing file."),
) -> None:
    """An annotated config template: every field, optional ones commented with their defaults."""
    from prime_lab.trainer.config import template_path

    text = template_path().read_text()
    if path is None:
        sys.stdout.write(text)
        return
    if path.exists() and not force:
        fail(f"{path} exists: pass -f/--force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    err(f"Wrote {path}. Check it with `prime rl validate @{path}`.")


@rl_app.command("validate")
def validate(
    configs: list[str] = typer.Argument(..., help="Config files (@file, @ file or a path).", metavar="CONFIG..."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Check configs; prints every problem as `file:line: key: message` and exits 1 if any is an error."""
    from prime_lab.trainer.config import validate_rl_file

    results = [validate_rl_file(config_path(c)) for c in configs]
    if output is OutputFormat.json:
        print_json([{"file": r.file, "ok": r.ok, "problems": [p.to_json() for p in r.problems]} for r in results])
    else:
        for result in results:
            for problem in result.problems:
                typer.echo(problem.format())
            if result.ok:
                notes = f" ({len(result.notes)} note{'s' * (len(result.notes) != 1)})" if result.notes else ""
                err(f"{result.file}: ok{notes}")
        bad = sum(len(r.errors) for r in results)
        if bad:
            err(f"{bad} problem{'s' * (bad != 1)} in {sum(not r.ok for r in results)} of {len(results)} "
                "file(s)")
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@rl_app.command("ls", hidden=True, help="Same as `list`.")
@rl_app.command("list")
def list_runs(
    output: OutputFormat = OUTPUT_OPTION,
    num: int = typer.Option(20, "-n", "--num", min=1, help="How many runs (newest first)."),
    kind: str | None = typer.Option(None, "-k", "--kind", help="Only runs of this kind: rl, eval or gepa."),
) -> None:
    """Local runs of every kind (RL, evaluations, GEPA), newest first (alias: ls)."""
    from prime_lab.lab.runs import KINDS, RunRegistry

    if kind is not None and kind not in KINDS:
        fail(f"unknown kind '{kind}': use one of {', '.join(KINDS)}")
    runs = [r for r in RunRegistry().runs() if kind is None or r.read_status().get("kind") == kind][:num]
    statuses = [r.status() for r in runs]
    if output is OutputFormat.json:
        print_json(statuses)
        return
    if not statuses:
        err("No runs yet. Evaluate with `prime eval run reverse-text`, or validate an RL config with "
            "`prime rl validate @configs/rl/reverse-text.toml`.")
        return
    runs_table(statuses)


@rl_app.command("logs")
def logs(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new events until the run ends."),
    tail: int | None = typer.Option(None, "-n", "--tail", min=0, help="Only the last N events."),
    component: list[str] = typer.Option(
        [], "-c", "--component", help="Only these sources: orchestrator, trainer, inference, eval, gepa, launcher."),
    level: str | None = typer.Option(None, "--level", help="Only log lines at this level or above."),
    since: str | None = typer.Option(None, "--since", help="Only events of the last 30s, 15m, 2h, 1d, ..."),
    search: str | None = typer.Option(None, "--search", help="Only events whose line contains TEXT (any case)."),
    regex: str | None = typer.Option(None, "--regex", help="Only events whose line matches PATTERN (any case)."),
    raw: bool = typer.Option(False, "-r", "--raw", help="Print the events as JSON lines."),
) -> None:
    """A run's events: logs, metrics, status changes, alerts.

    --search and --regex look at the event as printed without --raw (its time, source, level and text).
    """
    from prime_lab.lab.events import LEVELS, SOURCES, BadLine, Event, level_rank
    from prime_lab.lab.runs import FINAL_STATES, RunRegistry

    for c in component:
        if c not in SOURCES:
            fail(f"unknown component '{c}': use one of {', '.join(SOURCES)}")
    if level is not None and level.upper() not in LEVELS:
        fail(f"unknown level '{level}': use one of {', '.join(LEVELS)}")
    min_level = LEVELS.index(level.upper()) if level else 0
    not_before = time.time() - parse_duration(since, "--since") if since is not None else None
    try:
        pattern = re.compile(regex, re.IGNORECASE) if regex is not None else None
    except re.error as exc:
        fail(f"--regex {regex!r} is not a regular expression: {exc}")
    needle = search.casefold() if search is not None else None
    run = RunRegistry().get(run_id)
    log = run.event_log()

    def keep(event: Event) -> bool:
        if component and event.source not in component:
            return False
        if not_before is not None and event.time < not_before:
            return False
        if level is not None and not (event.kind == "log" and level_rank(event) >= min_level):
            return False
        if needle is None and pattern is None:
            return True
        line = format_event(event)
        return (needle is None or needle in line.casefold()) and (pattern is None or bool(pattern.search(line)))

    def show(event: Event) -> None:
        typer.echo(json.dumps(event.to_json(), separators=(",", ":")) if raw else format_event(event))

    def skipped(bad: BadLine) -> None:
        err(f"(skipped a corrupt event line at byte {bad.offset})")

    # One read gives the history and the offset to follow from, so nothing written in between is lost.
    items, offset = log.read(0)
    for bad in (i for i in items if isinstance(i, BadLine)):
        skipped(bad)
    events = [e for e in items if isinstance(e, Event) and keep(e)]
    for event in events[-tail:] if tail is not None else events:
        show(event)
    if not follow:
        return
    done_at: list[float] = []

    def finished() -> bool:
        # Keep reading for a moment after the final status, so the last events are not cut off.
        if run.state in FINAL_STATES:
            done_at.append(time.monotonic())
            return done_at[-1] - done_at[0] > 0.5
        return False

    try:
        for event in log.tail(offset, follow=True, poll=0.2, stop=finished, on_bad_line=skipped):
            if keep(event):
                show(event)
    except KeyboardInterrupt:
        pass


@rl_app.command("stop")
def stop(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    grace: float = typer.Option(30.0, "--grace", min=0.0, help="Seconds to wait for a clean exit before killing."),
) -> None:
    """Stop a run gracefully (it checkpoints and exits); stopping a finished run does nothing."""
    from prime_lab.lab.runs import RunRegistry

    result = RunRegistry().stop(run_id, grace=grace)
    err(result.message)


@rl_app.command("delete")
def delete(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    force: bool = typer.Option(False, "-f", "--force", help="Delete even a running run (it is stopped first)."),
) -> None:
    """Delete a run and everything it wrote."""
    from prime_lab.lab.runs import RunRegistry

    run = RunRegistry().delete(run_id, force=force)
    err(f"Deleted {run.id}")


# Read-only views of one run (workbench/cli/run_views.py), after the commands that manage runs in the help.
rl_app.command("get")(run_views.get)
rl_app.command("progress")(run_views.progress)
rl_app.command("metrics")(run_views.metrics)
rl_app.command("rollouts")(run_views.rollouts)
rl_app.command("checkpoints")(run_views.checkpoints)
