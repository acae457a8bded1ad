"""Root Typer app: the `prime` command and its groups."""

from __future__ import annotations

import contextlib
import sys

import typer

import prime_lab
from prime_lab.runs.registry import RunError
from prime_lab.workbench.cli.common import UserError, join_at_args
from prime_lab.workbench.cli.env import env_app
from prime_lab.workbench.cli.eval import eval_app
from prime_lab.workbench.cli.gepa import gepa_app
from prime_lab.workbench.cli.lab import lab_app
from prime_lab.workbench.cli.plain import PLAIN_OPTION, plain_help, split_plain
from prime_lab.workbench.cli.render import set_plain
from prime_lab.workbench.cli.rl import rl_app
from prime_lab.workbench.cli.sandbox import sandbox_app
from prime_lab.workbench.cli.secret import secret_app
from prime_lab.workbench.cli.serve import serve
from prime_lab.workbench.cli.sft import sft_app

app = typer.Typer(
    name="prime",
    help="prime-lab: improve LLMs on environments, locally: RL training, GEPA, evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"prime-lab {prime_lab.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    plain: bool = PLAIN_OPTION,  # listed in the help; `main` takes --plain out of the arguments before parsing
) -> None:
    """prime-lab: improve LLMs on environments, locally."""


app.add_typer(rl_app, name="train", help="Reinforcement learning: configs, runs, their metrics and rollouts.")
app.add_typer(rl_app, name="rl", help="Same as `prime train` (its older name; both stay).")
app.add_typer(sft_app, name="sft", help="Supervised fine-tuning: configs and runs (prime-rl's SFT configs run).")
app.add_typer(eval_app, name="eval", help="Evaluate models on environments (vf-eval's flags).")
app.add_typer(gepa_app, name="gepa", help="GEPA prompt optimization (headless; the same events as the TUI).")
app.add_typer(env_app, name="env", help="Environments: list (installed and built-in), init, install, uninstall.")
app.add_typer(secret_app, name="secret", help="Secrets (API keys) environments get as variables, stored locally.")
app.add_typer(sandbox_app, name="sandbox", help="Local sandboxes, where environments run model-written code: list, "
                                                "exec, logs, kill.")
app.command("serve")(serve)
app.add_typer(lab_app, name="lab", help="The Textual workbench (prime lab [PATH]), and a workspace: setup, doctor.")


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors print as `Error: ...` (exit 1), never as tracebacks."""
    args, plain = split_plain(join_at_args(list(sys.argv[1:] if argv is None else argv)))
    set_plain(plain)
    try:
        with plain_help(app) if plain else contextlib.nullcontext():
            app(args=args, prog_name="prime")  # standalone: click prints usage errors and exits with their code
    except (UserError, RunError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        sys.exit(getattr(exc, "code", 1))
    except KeyboardInterrupt:
        sys.exit(130)
