"""`prime train` (also `prime rl`): RL configs and runs, headless."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import (
    OUTPUT_OPTION,
    OutputFormat,
    config_path,
    err,
    print_json,
    write_new_file,
)
from prime_lab.workbench.cli.models import models
from prime_lab.workbench.cli.rl_run import restart, run
from prime_lab.workbench.cli.run_verbs import add_run_verbs

if TYPE_CHECKING:
    from prime_lab.problems.validation import Validation

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

    write_template(template_path().read_text(), path, force, "rl")


def write_template(text: str, path: Path | None, force: bool, group: str) -> None:
    if path is None:
        sys.stdout.write(text)
        return
    write_new_file(text, path, force)
    err(f"Wrote {path}. Check it with `prime {group} validate @{path}`.")


CONFIGS_ARGUMENT = typer.Argument(..., help="Config files (@file, @ file or a path).", metavar="CONFIG...")


@rl_app.command("validate")
def validate(configs: list[str] = CONFIGS_ARGUMENT, output: OutputFormat = OUTPUT_OPTION) -> None:
    """Check configs; prints every problem as `file:line: key: message` and exits 1 if any is an error."""
    from prime_lab.trainer.config import validate_rl_file

    report_validations([validate_rl_file(config_path(c)) for c in configs], output)


def report_validations(results: list[Validation[Any]], output: OutputFormat) -> None:
    """Every problem of each file (`file:line: key: message`, or json); exit 1 if any is an error."""
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


add_run_verbs(rl_app, kind=None)  # list, get, logs, stop, delete: of runs of every kind (workbench/cli/run_verbs.py)

# Read-only views of one RL run (workbench/cli/run_views.py), after the commands that manage runs in the help.
rl_app.command("progress")(run_views.progress)
rl_app.command("metrics")(run_views.metrics)
rl_app.command("rollouts")(run_views.rollouts)
rl_app.command("checkpoints")(run_views.checkpoints)
