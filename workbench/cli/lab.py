"""`prime lab [PATH] [--run RUN_ID]`: the Textual workbench. Textual is imported here, lazily, only when it runs."""

from __future__ import annotations

from pathlib import Path

import typer


def lab(
    path: Path | None = typer.Argument(None, help="A folder to browse (default: here) or a config to open."),
    run: str | None = typer.Option(None, "--run", help="Open this run's page."),
) -> None:
    """Workbench: browse configs and runs, edit and validate configs, launch and watch runs."""
    from prime_lab.workbench.cli.common import fail

    if path is not None and not path.exists():
        fail(f"no such file or folder: {path}")
    from prime_lab.workbench.app import create_app

    create_app(path, run_id=run).run()
