"""`prime sft`: supervised fine-tuning configs and runs, headless.

`prime sft run @cfg.toml` validates the config (ours, or prime-rl's SFT shape: trainer/sft_config.py), creates an
`sft` run and starts its supervisor (the trainer alone; torchrun past one process), as `prime rl run` does for RL;
the run verbs are the shared ones, scoped to SFT runs. A completed run's model is `model = "<run id>"` in RL and
SFT configs, and `-m <run id>` for `prime eval run` and `prime gepa run`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, config_path, fail
from prime_lab.workbench.cli.rl import CONFIGS_ARGUMENT, report_validations, write_template
from prime_lab.workbench.cli.rl_run import (
    ENV_FILE_OPTION,
    ENV_VAR_OPTION,
    FOREGROUND_OPTION,
    NAME_OPTION,
    WANDB_KEY_OPTION,
    YES_OPTION,
    _env_vars,
    launch,
    restart,
    valid_config,
)
from prime_lab.workbench.cli.run_verbs import add_run_verbs

sft_app = typer.Typer(
    help="Supervised fine-tuning: write, validate, run and manage SFT configs and runs (prime-rl's [data] shape).",
    no_args_is_help=True,
)


@sft_app.command("init")
def init(
    path: Path | None = typer.Argument(None, help="Write the template here (default: print it to stdout)."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite an existing file."),
) -> None:
    """An annotated SFT config template: every field, optional ones commented with their defaults."""
    from prime_lab.trainer.sft_config import template_path

    write_template(template_path().read_text(), path, force, "sft")


@sft_app.command("validate")
def validate(configs: list[str] = CONFIGS_ARGUMENT, output: OutputFormat = OUTPUT_OPTION) -> None:
    """Check SFT configs; prints every problem as `file:line: key: message` and exits 1 if any is an error."""
    from prime_lab.trainer.sft_config import validate_sft_file

    report_validations([validate_sft_file(config_path(c)) for c in configs], output)


@sft_app.command("run")
def run(
    config: str = typer.Argument(..., help="The SFT config (@file, @ file or a path).", metavar="CONFIG"),
    foreground: bool = FOREGROUND_OPTION,
    yes: bool = YES_OPTION,
    env_var: list[str] = ENV_VAR_OPTION,
    env_file: list[Path] = ENV_FILE_OPTION,
    name: str | None = NAME_OPTION,
    wandb_api_key: str | None = WANDB_KEY_OPTION,
) -> None:
    """Validate an SFT config and start a local SFT run. Prints the run id."""
    from prime_lab.trainer.sft_config import validate_sft_file

    path = config_path(config)
    cfg = valid_config(validate_sft_file(path), path, "sft")
    for section in (cfg.data, cfg.val.data if cfg.val is not None else None):
        if section is None:
            continue
        for source in section.source:
            source.dataset = local_dataset(source.dataset, path)
        if section.name is not None:
            section.name = local_dataset(section.name, path)
    launch("sft", path, cfg.model.name, cfg.model_dump(mode="json"),
           envs=[s.dataset for s in cfg.data.datasets], max_steps=cfg.max_steps, name=name,
           extra_env=_env_vars(env_var, env_file, wandb_api_key), foreground=foreground)


def local_dataset(name: str, config: Path) -> str:
    """A dataset name as the run reads it: a relative path that exists here or beside the config becomes absolute
    (the run's processes start elsewhere); anything else (a Hub id) stays as it is."""
    for base in (Path.cwd(), config.resolve().parent):
        candidate = (base / name).expanduser()
        if not Path(name).is_absolute() and candidate.exists():
            return str(candidate.resolve())
    if name.endswith((".jsonl", ".json", ".parquet")) and not Path(name).expanduser().exists():
        fail(f"{config}: [data] dataset {name!r}: no such file (looked in {Path.cwd()} and beside the config)")
    return name


sft_app.command("restart")(restart)
add_run_verbs(sft_app, kind="sft")
sft_app.command("progress")(run_views.progress)
sft_app.command("metrics")(run_views.metrics)
sft_app.command("checkpoints")(run_views.checkpoints)
