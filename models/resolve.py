"""Turn what a user wrote for a model (a preset, a folder, a Hugging Face id) into a local model folder.

`obtain_model` is the one question a command asks (where the model is, or how it is got: a preset built, a Hugging
Face id downloaded when the Hub is reachable), answered once per process; `resolve_model` answers from this machine
alone (the run's own processes, after the command obtained it); `local_model_folder` builds nothing either.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from prime_lab.models.presets import PRESETS, Availability, ModelPreset
from prime_lab.models.store import is_model_folder, materialise


class ModelNotFoundError(LookupError):
    """The model is not a preset, not a folder on disk, and not in the local Hugging Face cache."""


def resolve_model(spec: str) -> Path:
    """A local Hugging Face model folder for `spec`.

    - a preset name (`prime rl models`): its folder under `runs.paths.models_dir()`, materialised on first use;
    - a path to a folder with a `config.json`;
    - a Hugging Face id (`owner/name`, or `owner/name@revision`) already in the local Hugging Face cache;
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


def hugging_face_cache_folder(spec: str) -> Path | None:
    """The snapshot folder of `spec` (`owner/name[@revision]`, default `main`) in the local Hugging Face cache,
    without touching the network; None when it is not there or not whole (a download cut short: the files
    `download_model` takes that the cached file listing names are not all in it)."""
    from prime_lab.models.download import cache_folder, chosen_files, is_hub_id, split_revision

    if not is_hub_id(spec):
        return None
    repo_id, revision = split_revision(spec)
    # The cache location is read now, not when huggingface_hub was imported, so HF_HUB_CACHE set later counts.
    storage = cache_folder() / f"models--{repo_id.replace('/', '--')}"
    commit = revision or "main"
    if not _COMMIT.match(commit):
        ref = storage / "refs" / commit
        try:
            commit = ref.read_text().strip()
        except OSError:
            return None
    folder = storage / "snapshots" / commit
    if not is_model_folder(folder):
        return None
    try:
        from huggingface_hub import get_cached_repo_tree

        listed = [entry.path for entry in get_cached_repo_tree(repo_id, revision=commit, cache_dir=storage.parent)]
    except Exception:  # no listing cached (a cache copied from elsewhere, an older huggingface_hub): trust it
        return folder
    return folder if all((folder / name).exists() for name in chosen_files(listed)) else None


_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_obtained: dict[tuple[str, str], Path] = {}


def obtain_model(spec: str, *, token: str | None = None, out: TextIO | None = None,
                 on_download: Callable[[str, str], None] | None = None) -> Path:
    """The folder of model `spec`, getting it if it is not on this machine: a preset is built, a Hugging Face id
    (`owner/name[@revision]`) downloaded into the Hugging Face cache when the Hub is reachable (runs/hub_probe.py;
    `token` for a gated or private one, progress on `out`, `on_download(repo_id, commit)` told first). Answered
    once per process. ModelNotFoundError with one line otherwise: offline, it names the `hf download` to run where
    the Hub is reachable."""
    from prime_lab.models.download import cache_folder

    key = (spec, str(cache_folder()))
    known = _obtained.get(key)
    if known is not None and is_model_folder(known):
        return known
    try:
        folder = resolve_model(spec)
    except ModelNotFoundError:
        folder = _download(spec, token=token, out=out, on_download=on_download)
    _obtained[key] = folder
    return folder


def _download(spec: str, *, token: str | None, out: TextIO | None,
              on_download: Callable[[str, str], None] | None) -> Path:
    from prime_lab.models.download import DownloadError, download_model, is_hub_id, split_revision
    from prime_lab.runs.hub_probe import offline_reason

    if not is_hub_id(spec) or Path(spec).expanduser().exists():
        raise ModelNotFoundError(not_found_message(spec))
    repo_id, revision = split_revision(spec)
    why = offline_reason()
    if why is not None:
        raise ModelNotFoundError(offline_message(spec, why))
    try:
        return download_model(repo_id, revision, token=token, out=out,
                              on_start=(lambda commit: on_download(repo_id, commit)) if on_download else None)
    except DownloadError as exc:
        raise ModelNotFoundError(str(exc)) from None


def hf_download_command(spec: str) -> str:
    """`hf download owner/name [--revision REV]`: what gets Hugging Face id `spec` into the cache by hand."""
    repo_id, revision = spec.partition("@")[::2]
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")


def offline_message(spec: str, why: str) -> str:
    """One line for a Hugging Face id that is neither on this machine nor downloadable now."""
    return (f"model {spec!r} is not on this machine and {why}: run `{hf_download_command(spec)}` where the Hub is "
            "reachable and copy the Hugging Face cache here, or run this command again with a network")


def not_found_message(spec: str) -> str:
    presets = ", ".join(PRESETS)
    return (
        f"model {spec!r} is not a preset, not a folder on this machine, and not in the local Hugging Face cache. "
        f"Use one of:\n"
        f"  - a preset ({presets}; `prime rl models` lists them),\n"
        f"  - a local folder holding a Hugging Face model (config.json, *.safetensors, tokenizer files),\n"
        f"  - a completed SFT run's id or --name (`prime sft list`),\n"
        f"  - a Hugging Face id (OWNER/NAME[@REVISION]): `prime rl run`, `prime eval run` and `prime serve` "
        f"download it when the Hub is reachable; else download it on a machine with hub access "
        f"(`hf download {spec if '/' in spec else 'OWNER/NAME'}`), then copy the cache or the folder here."
    )
