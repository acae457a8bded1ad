"""Policy versions on disk: the folder the trainer publishes after each step for the sampler.

A LoRA run publishes `adapters/step_N/` (a peft adapter); full fine-tuning publishes `weights/step_N/`, the whole
model as `save_pretrained` writes it (`config.json` and HF-named safetensors: a folder transformers and vLLM load,
and the orchestrator hands to the sampler through `inference.control.RuntimeWeights`). Version N is the policy
after step N; version 0, published only on a resume or a warm start, is the policy the run starts from. Both kinds
are written under a temporary name and renamed (runs/atomic.py's `publish_folder`), and the same `[adapters]`
settings decide how many are kept. Full weights are published in the dtype the policy computes in
(`save_weights`): bfloat16 on CUDA, where the trainer keeps float32 master weights (trainer/model.py `Precision`),
so the sampler loads what it would load of the base model; a checkpoint keeps the float32 weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from prime_lab.models.store import holds_full_weights
from prime_lab.runs.registry import Run
from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.runtime import checkpoint_to_resume, step_dirs
from prime_lab.trainer.sft_config import SFTConfig

WEIGHTS_DIR = "weights"


def weights_dir(run: Run) -> Path:
    return run.dir / WEIGHTS_DIR


def versions_dir(run: Run, config: RLConfig | SFTConfig) -> Path:
    """Where the run's policy versions are published: `adapters/` (LoRA) or `weights/` (full fine-tuning)."""
    return run.adapters_dir if config.lora.enabled else weights_dir(run)


def drop_versions_after(root: Path, step: int) -> None:
    """Delete the versions newer than `step`: on a resume from the checkpoint of `step`, those were published by
    the attempt that stopped, and a sampler must never load them as the resumed run's."""
    for k, path in step_dirs(root).items():
        if k > step:
            shutil.rmtree(path, ignore_errors=True)


def warm_start_weights(checkpoint_id: str, runs_root: Path) -> Path:
    """`checkpoint_id` as full weights to start a full fine-tuning run from: a model folder (a full fine-tuning run's
    checkpoints/step_N or weights/step_N), or a run id (its newest checkpoint). Raises ValueError with what to do."""
    path = Path(checkpoint_id).expanduser()
    if holds_full_weights(path):
        return path
    found = checkpoint_to_resume(Run(runs_root / checkpoint_id)) if (runs_root / checkpoint_id).is_dir() else None
    if found and holds_full_weights(found[1]):
        return found[1]
    if found or (path / "adapter_config.json").is_file():
        raise ValueError(f"checkpoint_id: {checkpoint_id!r} holds a LoRA adapter, and [lora] enabled = false trains "
                         "the full model: start from full weights (a full fine-tuning run's checkpoint), or set "
                         "[lora] enabled = true")
    raise ValueError(f"checkpoint_id: {checkpoint_id!r} is neither a run id under {runs_root} with a checkpoint nor "
                     "a model folder (config.json and *.safetensors, e.g. a full fine-tuning run's "
                     "checkpoints/step_N)")


def save_weights(model: Any, folder: Path, state: dict[str, Any] | None = None) -> None:
    """`model` as a model folder (`save_pretrained`), its weights in its compute dtype: float32 master weights are
    cast down (on the CPU, a tensor at a time; tied weights stay tied) and config.json names the compute dtype, so a
    sampler loading the folder takes half the memory and time of the masters. `state`: the weights to write (FSDP's,
    gathered), else the model's own."""
    from prime_lab.trainer.model import precision_of

    precision = precision_of(model)
    if precision is None or precision.params == precision.compute:
        model.save_pretrained(folder, **({"state_dict": state} if state is not None else {}))
        return
    cast: dict[tuple[int, tuple[int, ...]], Any] = {}  # one copy of each stored tensor: a tied head stays tied
    written: dict[str, Any] = {}
    for name, tensor in (state if state is not None else model.state_dict()).items():
        if tensor.dtype != precision.params:
            written[name] = tensor
            continue
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in cast:
            cast[key] = tensor.detach().to("cpu", precision.compute)
        written[name] = cast[key]
    model.save_pretrained(folder, state_dict=written)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["dtype"] = str(precision.compute).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
