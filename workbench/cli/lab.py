"""`prime lab`: the Textual workbench (`prime lab [PATH] [--run RUN_ID]`), and the workspace it works in:
`prime lab setup [FOLDER]` writes one, `prime lab doctor [FOLDER]` checks it and this machine.

`prime lab PATH` is `prime lab open PATH`: the group sends anything that is not one of its commands to `open`, so a
folder or a config opens as before (a folder named like a command opens as `prime lab ./setup`). Textual is
imported only when the workbench runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, config_path, fail, print_json
from prime_lab.workbench.cli.render import console, is_plain, print_table, size

if TYPE_CHECKING:
    from prime_lab.problems.validation import Validation
    from prime_lab.workspace.doctor import Finding
    from prime_lab.workspace.layout import SetupResult
    from prime_lab.workspace.machine import Machine

OPEN = "open"


class LabGroup(TyperGroup):
    """A group whose default command is `open`: `prime lab`, `prime lab FOLDER`, `prime lab x.toml` and
    `prime lab --run ID` open the workbench; `prime lab setup` and `prime lab doctor` are commands. (`ctx` is
    typer's own click Context, whose class typer does not export.)"""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = [OPEN, *args]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[PATH] [--run RUN_ID]", "|", self.subcommand_metavar]


lab_app = typer.Typer(cls=LabGroup, no_args_is_help=False)


@lab_app.callback()
def _lab() -> None:
    """Workbench: browse configs and runs, edit and validate configs, launch and watch runs. `prime lab [PATH]`
    opens it on a folder (default: here) or a config; `setup` writes a workspace, `doctor` checks it."""


@lab_app.command(OPEN)
def open_workbench(
    path: str | None = typer.Argument(None, metavar="PATH",
                                      help="A folder to browse (default: here) or a config to open."),
    run: str | None = typer.Option(None, "--run", help="Open this run's page."),
) -> None:
    """Open the workbench on a folder or a config (the default command: `prime lab PATH`)."""
    target = config_path(path) if path is not None else None
    if target is not None and not target.exists():
        fail(f"no such file or folder: {target}")
    from prime_lab.workbench.app import create_app

    create_app(target, run_id=run).run()


@lab_app.command("setup")
def setup(
    folder: Path = typer.Argument(Path("."), help="The workspace folder (created if need be; default: here)."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite files that differ from the templates."),
    verifiers: bool = typer.Option(False, "--verifiers",
                                   help="Write the example environment in verifiers' classic API."),
    v1: bool = typer.Option(False, "--v1", help="Write the example environment as a verifiers v1 taskset "
                                                "(verifiers 0.4's API)."),
) -> None:
    """Write a workspace here or in FOLDER: configs that run on this machine, an example environment, a .gitignore."""
    from prime_lab.envs.scaffold import ScaffoldError
    from prime_lab.workspace.layout import setup_workspace
    from prime_lab.workspace.machine import survey

    if folder.exists() and not folder.is_dir():
        fail(f"{folder} is a file, not a folder")
    try:
        result = setup_workspace(folder, force=force, verifiers=verifiers, v1=v1)
    except ScaffoldError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the workspace: {exc}")
    _print_actions(result)
    typer.echo("")
    machine_table(survey())
    typer.echo("")
    _get_started(folder)


def _print_actions(result: SetupResult) -> None:
    from prime_lab.workspace.layout import Change

    unchanged = [a for a in result.actions if a.change is Change.UNCHANGED]
    for action in result.actions:
        if action.change is not Change.UNCHANGED and action.path != result.folder:
            detail = f" ({action.detail})" if action.detail else ""
            typer.echo(f"{action.change.value:<11} {_shown(action.path, result.folder)}{detail}")
        elif action.path == result.folder and action.change is Change.CREATED:
            typer.echo(f"{'created':<11} {result.folder}/")
    if not result.changed:
        typer.echo(f"Nothing changed: {result.folder} is set up already ({len(unchanged)} files as the templates "
                   "have them; -f/--force overwrites the ones that differ).")
    elif unchanged:
        typer.echo(f"{len(unchanged)} files were already as the templates have them.")


def _shown(path: Path, folder: Path) -> str:
    rel = path.relative_to(folder) if path.is_relative_to(folder) else path
    return f"{rel}/" if path.is_dir() else str(rel)


def _get_started(folder: Path) -> None:
    from prime_lab.workspace.layout import EXAMPLE_ENVIRONMENT, config_templates

    sft = next((rel for rel, _ in config_templates() if rel.startswith("configs/sft/") and rel.endswith(".toml")),
               None)
    here = folder.resolve() == Path.cwd().resolve()
    lines = ([] if here else [(f"cd {folder}", "")]) + [
        ("prime lab doctor", "check the workspace and this machine"),
        ("prime eval run reverse-text -n 5", "a baseline: SmolLM2 on a built-in environment"),
        ("prime eval run @configs/eval/reverse-text.toml", "the same from a config"),
        ("prime gepa run @configs/gepa/reverse-text.toml", "optimize its system prompt"),
        *([(f"prime sft run @{sft} --name {Path(sft).stem}-sft", "teach the answer's format first")] if sft else []),
        ("prime rl run @configs/rl/reverse-text.toml", "train it with RL (LoRA)"),
        (f"prime env install environments/{EXAMPLE_ENVIRONMENT}", "your own environment (edit my_env.py), installed"),
        (f"prime eval run {EXAMPLE_ENVIRONMENT} -n 5", "then evaluate it"),
        ("prime lab .", "the workbench on this folder"),
    ]
    if is_plain():
        width = max(len(command) for command, _ in lines)
        rows = (f"{command:<{width}}  # {note}" if note else command for command, note in lines)
        typer.echo("Get started:\n" + "\n".join(rows))
        return
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(style="dim")
    for command, note in lines:
        grid.add_row(command, note)
    console().print(Panel(grid, title="Get started", title_align="left", expand=False))


@lab_app.command("doctor")
def doctor(
    folder: Path = typer.Argument(Path("."), help="The workspace folder (default: here)."),
    fix: bool = typer.Option(False, "--fix", help="Repair what is safe to: missing folders, the .gitignore."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Check this machine and a workspace: configs, environment ids and packages, .gitignore (exit 1 on a failure)."""
    from prime_lab.workspace.doctor import check_workspace, failed, fix_workspace
    from prime_lab.workspace.machine import survey

    if not folder.is_dir():
        fail(f"no such folder: {folder}" + ("" if folder.exists() else f" (prime lab setup {folder} writes one)"))
    fixed = fix_workspace(folder) if fix else []
    machine = survey()
    findings = check_workspace(folder, validate_config)
    if output == OutputFormat.json:
        print_json({"folder": str(folder.resolve()), "ok": not failed(findings), "fixed": fixed,
                    "machine": machine.to_json(), "checks": [f.to_json() for f in findings]})
    else:
        for done in fixed:
            typer.echo(f"fixed: {done}")
        machine_table(machine)
        typer.echo("")
        _print_findings(findings)
    raise typer.Exit(1 if failed(findings) else 0)


def validate_config(path: Path) -> tuple[str, Validation[Any]]:
    """A config's kind (by its folder under configs/: rl, sft, gepa, eval; else by its contents, as the workbench
    reads it) and its validation, with the command's own validator (`prime rl validate` checks [lora] targets against
    the model when it is on this machine)."""
    from prime_lab.evals.evaluation import validate_eval_file
    from prime_lab.workbench.config_document import detect_kind
    from prime_lab.workspace.layout import CONFIG_KINDS

    kind = next((parent.name for parent in path.parents
                 if parent.name in CONFIG_KINDS and parent.parent.name == "configs"), None)
    if kind is None:
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError):
            text = ""
        kind = detect_kind(Path(path.name), text)
    if kind == "rl":
        from prime_lab.trainer.config import validate_rl_file

        return kind, validate_rl_file(path)
    if kind == "sft":
        from prime_lab.trainer.sft_config import validate_sft_file

        return kind, validate_sft_file(path)
    if kind == "gepa":
        from prime_lab.gepa.config import validate_gepa_file

        return kind, validate_gepa_file(path)
    return kind, validate_eval_file(path)


_STATUS_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red")}


def _print_findings(findings: list[Finding]) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    for finding in findings:
        label, style = _STATUS_STYLE[finding.status]
        if is_plain():
            typer.echo(f"{label:<5} {finding.format()}")
        else:
            console.print(Text.assemble((f"{label:<5}", style), " ", finding.format()))
    failures = sum(f.status == "fail" for f in findings)
    warnings = sum(f.status == "warn" for f in findings)
    if failures:
        typer.echo(f"{failures} failure{'s' if failures != 1 else ''}, {warnings} warning"
                   f"{'s' if warnings != 1 else ''}: fix the lines above (--fix repairs folders and the .gitignore).")
    else:
        typer.echo(f"All good ({len(findings)} checks" + (f", {warnings} warnings)." if warnings else ")."))


def machine_table(machine: Machine) -> None:
    """What this machine offers, a row per fact (setup and doctor print it)."""
    gpus = "; ".join(f"{g.name} ({size(g.memory_bytes)})" for g in machine.gpus)
    memory = "-" if machine.memory_bytes is None else size(machine.memory_bytes) + (
        f" ({size(machine.memory_available_bytes)} available)" if machine.memory_available_bytes is not None else "")
    disk = "-" if machine.disk_free_bytes is None else f"{size(machine.disk_free_bytes)} free" + (
        f" of {size(machine.disk_total_bytes)}" if machine.disk_total_bytes else "")
    rows = [
        ("prime-lab", f"{machine.prime_lab} (Python {machine.python})"),
        ("cores", f"{machine.cores} usable" + (f" (of {machine.cores_total})"
                                               if machine.cores_total != machine.cores else "")),
        ("memory", memory),
        ("GPU", f"{gpus} ({machine.gpu_note})" if gpus else f"none ({machine.gpu_note})"),
        *((f"engine {e.name}", ("works: " if e.works else "no: ") + e.detail) for e in machine.engines),
        ("engine auto", machine.auto_engine),
        *((f"model {m.name}", f"{m.availability}: {m.detail}") for m in machine.models),
        ("runs", f"{machine.runs_dir}: {disk}"),
    ]
    print_table(("MACHINE", ""), rows, overflow="fold")
