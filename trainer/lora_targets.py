"""What a LoRA config's targets match in a model, matched the way peft matches them (the whole name, or its end
after a dot):

- `[lora].target_modules` name modules: peft wraps those layers (the Linear layers: q_proj, ..., lm_head);
- `[lora].target_parameters` name parameters: peft wraps the parameter itself, which is how it reaches the experts of
  a transformers-5 Mixture-of-Experts model (fused 3-D parameters, `mlp.experts.gate_up_proj` and
  `mlp.experts.down_proj`; the router, `mlp.gate.weight`, only when named).

peft refuses targets that match nothing only when *no* target matches, so a misspelt expert name would silently
train the attention alone. The trainer refuses any target that matches nothing (`check_targets`), naming what the
model has; `prime rl validate` and `prime rl run` do the same when the run's model is already on this machine
(`local_target_problems`). Both read a `ModelOutline` (module names, which are Linear layers, parameter names and
dimensions). The local check builds the model on the meta device (no weight is read) once per model configuration:
its outline is kept in `cache_dir()/model-outlines/`, keyed by the config.json's bytes and the installed
transformers and torch releases (what `from_config` builds depends on nothing else), so a later check reads a JSON
file instead of importing torch and transformers (`prime rl validate` on a tiny model: 4.4 s, then 0.4 s).

torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.paths import cache_dir

_LAYER_PREFIX = re.compile(r"^.*?\.\d+\.")  # "model.layers.0." in "model.layers.0.mlp.experts.gate_up_proj"


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


@dataclass(frozen=True)
class ModelOutline:
    """What the target checks read of a model: its modules' names, those of its Linear layers, and its parameters'
    names with their number of dimensions, in the model's order."""

    modules: tuple[str, ...]
    linear: tuple[str, ...]
    parameters: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, model: Any) -> ModelOutline:
        import torch

        named = list(model.named_modules())
        return cls(tuple(n for n, _ in named), tuple(n for n, m in named if isinstance(m, torch.nn.Linear)),
                   tuple((n, p.dim()) for n, p in model.named_parameters()))

    def to_json(self) -> dict[str, Any]:
        return {"modules": self.modules, "linear": self.linear, "parameters": self.parameters}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelOutline:
        return cls(tuple(map(str, data["modules"])), tuple(map(str, data["linear"])),
                   tuple((str(n), int(d)) for n, d in data["parameters"]))


def linear_layer_names(outline: ModelOutline) -> list[str]:
    """The short names of the model's Linear layers (what `target_modules` usually names), sorted."""
    return sorted({n.rsplit(".", 1)[-1] for n in outline.linear})


def expert_parameter_names(outline: ModelOutline) -> list[str]:
    """The model's 3-D parameters (fused MoE experts) by their name inside a layer, e.g. `mlp.experts.down_proj`,
    in the model's order."""
    names = [_LAYER_PREFIX.sub("", n) for n, dim in outline.parameters if dim >= 3]
    return list(dict.fromkeys(names))


def target_problems(outline: ModelOutline, target_modules: list[str], target_parameters: list[str],
                    model_name: str) -> list[tuple[str, str]]:
    """(`[lora]` key, message) for each of the two settings naming something that matches nothing in the model."""
    problems: list[tuple[str, str]] = []
    modules = outline.modules
    parameters = [n for n, _ in outline.parameters]
    experts = expert_parameter_names(outline)
    has = f"its 3-D expert parameters are {', '.join(experts)}" if experts else "it has no 3-D expert parameters"
    missing = [t for t in target_modules if not any(_matches(n, t) for n in modules)]
    if missing:
        parameter_like = [t for t in missing if any(_matches(n, t) for n in parameters)]
        hint = (f"; {', '.join(parameter_like)} {'is a parameter' if len(parameter_like) == 1 else 'are parameters'}"
                ", not a module: name it in target_parameters" if parameter_like else "")
        linears = ", ".join(linear_layer_names(outline)[:12])
        problems.append(("target_modules", f"{', '.join(missing)} not found in {model_name}; its linear layers are "
                                           f"{linears}, and {has} (for target_parameters){hint}"))
    missing = [t for t in target_parameters if not any(_matches(n, t) for n in parameters)]
    if missing:
        problems.append(("target_parameters", f"{', '.join(missing)} matches no parameter of {model_name}; {has} "
                                              "(the router, e.g. mlp.gate.weight, only when named)"))
    return problems


def check_targets(model: Any, target_modules: list[str], target_parameters: list[str], model_name: str) -> None:
    """Raise ValueError naming each `[lora]` target that matches nothing in `model`, and what the model has."""
    problems = target_problems(ModelOutline.of(model), target_modules, target_parameters, model_name)
    if problems:
        raise ValueError("; ".join(f"[lora].{key}: {message}" for key, message in problems))


def local_target_problems(model_spec: str, target_modules: list[str],
                          target_parameters: list[str]) -> list[tuple[str, str]]:
    """`target_problems` for the run's `model` if it is already on this machine (a materialised preset, a folder,
    the Hugging Face cache); nothing otherwise (nothing is built or downloaded to check)."""
    from prime_lab.models.resolve import local_model_folder

    folder = local_model_folder(model_spec)
    if folder is None:
        return []
    try:
        outline = local_outline(folder)
    except Exception:  # a model transformers cannot build here (its config refused, too): the trainer says why
        return []
    return target_problems(outline, target_modules, target_parameters, model_spec)


def outline_key(config: bytes) -> str:
    """The cache key of a model configuration: its config.json's bytes and the transformers and torch releases."""
    versions = []
    for package in ("transformers", "torch"):
        try:
            versions.append(importlib.metadata.version(package))
        except importlib.metadata.PackageNotFoundError:
            versions.append("")
    return hashlib.sha256(config + "\0".join(["", *versions]).encode()).hexdigest()[:32]


def local_outline(folder: Path) -> ModelOutline:
    """The outline of the model in `folder`: from the cache, else built on the meta device and kept there (a cache
    that cannot be written is skipped). Held in this process too while config.json is unchanged: the editor
    validates on every change, with or without a cache it can write."""
    return _outline(str(folder), outline_key((folder / "config.json").read_bytes()))


@functools.lru_cache(maxsize=4)
def _outline(folder: str, key: str) -> ModelOutline:
    cached = cache_dir() / "model-outlines" / f"{key}.json"
    try:
        return ModelOutline.from_json(json.loads(cached.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    outline = ModelOutline.of(_meta_model(folder))
    try:
        write_json_atomic(cached, outline.to_json(), indent=None)
    except OSError:
        pass
    return outline


def _meta_model(folder: str) -> Any:
    """The model of `folder` built on the meta device: its modules and parameter shapes, no memory for weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
