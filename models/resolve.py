"""Turn what a user wrote for a model (a preset, a folder, a Hugging Face id) into a local model folder."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from prime_lab.models.presets import PRESETS, Availability, ModelPreset
from prime_lab.models.store import is_model_folder, materialise


class ModelNotFoundError(LookupError):
    """The model is not a preset, not a folder on disk, and not in the local Hugging Face cache."""


def resolve_model(spec: str) -> Path:
    """A local Hugging Face model folder for `spec`.

    - a preset name (`prime rl models`): its folder under `runs.paths.models_dir()`, materialised on first use;
    - a path to a folder with a `config.json`;
    - a Hugging Face id (`owner/name`) already downloaded into the local Hugging Face cache;
    - the id of a completed SFT run (its `model/` folder: the base model with the run's training merged in), or
      the name it was started with (`--name`; the newest such run).
    Anything else raises ModelNotFoundError saying what to do.
    """
    preset = PRESETS.get(spec)
    if preset is not None:
        return materialise_preset(preset)
    trained = run_model_folder(spec)
    if trained is not None:
        return trained
    path = Path(spec).expanduser()
    if path.exists():
        if is_model_folder(path):
            return path.resolve()
        raise ModelNotFoundError(
            f"{spec!r} exists but is not a Hugging Face model folder (it has no config.json). Point at the "
            "folder that holds config.json, the weights (*.safetensors) and the tokenizer files."
        )
    named = named_run_model_folder(spec)
    if named is not None:
        return named
    cached = hugging_face_cache_folder(spec)
    if cached is not None:
        return cached
    raise ModelNotFoundError(not_found_message(spec))


def local_model_folder(spec: str) -> Path | None:
    """The folder `resolve_model(spec)` returns when it is already on this machine (nothing is built or
    downloaded); None when it is not, or when `spec` names no model."""
    preset = PRESETS.get(spec)
    if preset is not None:
        return preset.folder() if preset.availability() is Availability.PRESENT else None
    with contextlib.suppress(ModelNotFoundError):
        trained = run_model_folder(spec)
        if trained is not None:
            return trained
    path = Path(spec).expanduser()
    if path.exists():
        return path.resolve() if is_model_folder(path) else None
    return named_run_model_folder(spec) or hugging_face_cache_folder(spec)


def local_tokenizer(spec: str) -> Any | None:
    """The tokenizer of model `spec` when it is had without building or downloading the model: from its folder on
    this machine, or a preset's built alone (`ModelPreset.tokenizer`); None when neither is. Imports transformers."""
    folder = local_model_folder(spec)
    if folder is not None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    preset = PRESETS.get(spec)
    return preset.tokenizer() if preset is not None and preset.tokenizer is not None else None


def run_model_folder(spec: str) -> Path | None:
    """The model an SFT run wrote, when `spec` is a run's id (None when it names no run); ModelNotFoundError when
    the run has no model (yet)."""
    if not spec or "/" in spec or spec.startswith((".", "~")):
        return None
    from prime_lab.runs.paths import runs_dir
    from prime_lab.runs.registry import Run

    run = Run(runs_dir() / spec)
    if not run.status_path.is_file():
        return None
    if is_model_folder(run.model_dir):
        return run.model_dir.resolve()
    status = run.read_status()
    kind, state = status.get("kind"), status.get("state")
    if kind != "sft":
        raise ModelNotFoundError(f"{spec!r} is {'an' if kind == 'rl' else 'a'} {kind} run: only an SFT run's id "
                                 "names a model (an RL run's adapter warm-starts another RL run as its "
                                 "`checkpoint_id`)")
    raise ModelNotFoundError(f"SFT run {spec} has no model yet ({state}): its model is written when its last step "
                             f"is done" + (f"; resume it with `prime sft restart {spec}`" if state in
                                           ("failed", "stopped") else ""))


def named_run_model_folder(name: str) -> Path | None:
    """The model of the newest completed SFT run started with `--name NAME` (so a config can name the SFT run it
    builds on before its id exists: `prime sft run @sft.toml --name reverse-text-sft`, then `model =
    "reverse-text-sft"`)."""
    from prime_lab.runs.paths import runs_dir
    from prime_lab.runs.registry import Run

    if not name or "/" in name or not runs_dir().is_dir():
        return None
    found: list[tuple[float, Path]] = []
    for run in (Run(status.parent) for status in runs_dir().glob("*/status.json")):
        status = run.read_status()
        if status.get("kind") == "sft" and status.get("name") == name and is_model_folder(run.model_dir):
            found.append((float(status.get("created_at") or 0.0), run.model_dir.resolve()))
    return max(found)[1] if found else None


def materialise_preset(preset: ModelPreset) -> Path:
    if preset.availability() is Availability.MISSING:
        raise ModelNotFoundError(f"model preset {preset.name!r} cannot be built here: {preset.missing_hint}")
    return materialise(preset.folder(), preset.build)


def hugging_face_cache_folder(repo_id: str) -> Path | None:
    """The snapshot folder of `repo_id` in the local Hugging Face cache, without touching the network."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        # The cache location is read now, not when huggingface_hub was imported, so HF_HUB_CACHE set later counts.
        cache_dir = os.environ.get("HF_HUB_CACHE") or None
        folder = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=cache_dir))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    return folder if is_model_folder(folder) else None


def not_found_message(spec: str) -> str:
    presets = ", ".join(PRESETS)
    return (
        f"model {spec!r} is not a preset, not a folder on this machine, and not in the local Hugging Face cache. "
        f"Use one of:\n"
        f"  - a preset ({presets}; `prime rl models` lists them),\n"
        f"  - a local folder holding a Hugging Face model (config.json, *.safetensors, tokenizer files),\n"
        f"  - a completed SFT run's id or --name (`prime sft list`),\n"
        f"  - a Hugging Face id: download it first on a machine with hub access "
        f"(`hf download {spec if '/' in spec else 'OWNER/NAME'}`), then copy the cache or the folder here."
    )
