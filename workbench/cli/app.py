"""Root Typer app: the `prime` command and its groups."""

from __future__ import annotations

import sys

import typer

import lab

app = typer.Typer(
    name="prime",
    help="prime-lab: improve LLMs on environments, locally: RL training, GEPA, evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"prime-lab {lab.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """prime-lab: improve LLMs on environments, locally."""


def main(argv: list[str] | None = None) -> None:
    app(args=argv if argv is not None else sys.argv[1:], prog_name="prime")
