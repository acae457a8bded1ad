"""GEPA -> RL from a GEPA run's page, textual-free: the RL config `prime gepa export RUN --rl` writes (gepa.export),
validated, written beside the workspace as `configs/rl/from-<run id>.toml` (a new name when that file exists: an
existing file is never overwritten), for the editor to open."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prime_lab.gepa.export import ExportError, GepaResult, rl_config, seed_warning, takes_system_prompt
from prime_lab.runs.registry import Run
from prime_lab.trainer.config import validate_rl_config


@dataclass(frozen=True)
class ExportedConfig:
    path: Path
    env_id: str
    through_args: bool  # the prompt is in [[env]].args (the environment takes system_prompt), else in system_prompt
    warning: str | None = None  # no candidate beat the seed: the config starts from the environment's own prompt

    def how(self) -> str:
        from prime_lab.gepa.export import prompt_route

        return prompt_route(self.env_id, self.through_args)


def new_config_path(folder: Path, stem: str) -> Path:
    """`folder/stem.toml`, or `stem-2.toml`, `stem-3.toml`, ... the first that does not exist."""
    path, number = folder / f"{stem}.toml", 2
    while path.exists():
        path, number = folder / f"{stem}-{number}.toml", number + 1
    return path


def export_rl(run: Run, root: Path) -> ExportedConfig:
    """Write the RL config that starts from `run`'s best prompt under `root/configs/rl/`. Raises ExportError (the run
    has no best prompt, or the config does not validate), EnvironmentLoadError (its environment does not load) or
    OSError."""
    result = GepaResult.of(run)
    through_args = takes_system_prompt(result.env_id)
    text = rl_config(result, through_args=through_args)
    folder = root / "configs" / "rl"
    checked = validate_rl_config(text, str(new_config_path(folder, f"from-{run.id}")))
    if not checked.ok:
        raise ExportError("the exported config does not validate: " + "; ".join(p.format() for p in checked.errors))
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        path = new_config_path(folder, f"from-{run.id}")
        try:
            with path.open("x", encoding="utf-8") as fh:  # (a file made meanwhile is not overwritten: the next name)
                fh.write(text)
        except FileExistsError:
            continue
        return ExportedConfig(path, result.env_id, through_args, seed_warning(result))
