"""`prime env list`: the environments this machine can run (built-ins and installed packages), with arguments."""

from __future__ import annotations

import typer

from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, print_json

env_app = typer.Typer(help="Environments: list the built-in ones and their arguments.", no_args_is_help=True)


@env_app.command("list")
def list_envs(output: OutputFormat = OUTPUT_OPTION) -> None:
    """Built-in environments, each with its load_environment() arguments and defaults."""
    from rich.console import Console
    from rich.table import Table

    from prime_lab.lab.envs import builtin_environments

    infos = builtin_environments()
    if output is OutputFormat.json:
        print_json([{"id": i.id, "module": i.module, "description": i.doc,
                     "args": [{"name": a.name, "default": a.default, "required": a.required} for a in i.args]}
                    for i in infos])
        return
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True)
    table.add_column("DESCRIPTION", ratio=1)
    table.add_column("ARGS", ratio=1)
    for info in infos:
        args = ", ".join(a.name if a.required else f"{a.name}={a.default!r}" for a in info.args
                         if a.name != "system_prompt")
        table.add_row(info.id, info.doc.split(": ", 1)[-1], args)
    Console().print(table)
