"""What a LoRA config's targets match in a model, matched the way peft matches them (the whole name, or its end
after a dot):

- `[lora].target_modules` name modules: peft wraps those layers (the Linear layers: q_proj, ..., lm_head);
- `[lora].target_parameters` name parameters: peft wraps the parameter itself, which is how it reaches the experts of
  a transformers-5 Mixture-of-Experts model (fused 3-D parameters, `mlp.experts.gate_up_proj` and
  `mlp.experts.down_proj`; the router, `mlp.gate.weight`, only when named).

peft refuses targets that match nothing only when *no* target matches, so a misspelt expert name would silently
train the attention alone. The trainer refuses any target that matches nothing (`check_targets`), naming what the
model has; `prime rl validate` does the same when the run's model is already on this machine
(`local_target_problems`: the model is built on the meta device, no weight is read).

torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_LAYER_PREFIX = re.compile(r"^.*?\.\d+\.")  # "model.layers.0." in "model.layers.0.mlp.experts.gate_up_proj"


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def linear_layer_names(model: Any) -> list[str]:
    """The short names of the model's Linear layers (what `target_modules` usually names), sorted."""
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def expert_parameter_names(model: Any) -> list[str]:
    """The model's 3-D parameters (fused MoE experts) by their name inside a layer, e.g. `mlp.experts.down_proj`,
    in the model's order."""
    names = [_LAYER_PREFIX.sub("", n) for n, p in model.named_parameters() if p.dim() >= 3]
    return list(dict.fromkeys(names))


def target_problems(model: Any, target_modules: list[str], target_parameters: list[str],
                    model_name: str) -> list[tuple[str, str]]:
    """(`[lora]` key, message) for each of the two settings naming something that matches nothing in `model`."""
    problems: list[tuple[str, str]] = []
    modules = [n for n, _ in model.named_modules()]
    parameters = [n for n, _ in model.named_parameters()]
    experts = expert_parameter_names(model)
    has = f"its 3-D expert parameters are {', '.join(experts)}" if experts else "it has no 3-D expert parameters"
    missing = [t for t in target_modules if not any(_matches(n, t) for n in modules)]
    if missing:
        parameter_like = [t for t in missing if any(_matches(n, t) for n in parameters)]
        hint = (f"; {', '.join(parameter_like)} {'is a parameter' if len(parameter_like) == 1 else 'are parameters'}"
                ", not a module: name it in target_parameters" if parameter_like else "")
        linears = ", ".join(linear_layer_names(model)[:12])
        problems.append(("target_modules", f"{', '.join(missing)} not found in {model_name}; its linear layers are "
                                           f"{linears}, and {has} (for target_parameters){hint}"))
    missing = [t for t in target_parameters if not any(_matches(n, t) for n in parameters)]
    if missing:
        problems.append(("target_parameters", f"{', '.join(missing)} matches no parameter of {model_name}; {has} "
                                              "(the router, e.g. mlp.gate.weight, only when named)"))
    return problems


def check_targets(model: Any, target_modules: list[str], target_parameters: list[str], model_name: str) -> None:
    """Raise ValueError naming each `[lora]` target that matches nothing in `model`, and what the model has."""
    problems = target_problems(model, target_modules, target_parameters, model_name)
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
        model = _meta_model(str(folder), (folder / "config.json").stat().st_mtime_ns)
    except (OSError, ValueError, KeyError, ImportError):  # a model transformers cannot build here: the trainer says why
        return []
    return target_problems(model, target_modules, target_parameters, model_spec)


@functools.lru_cache(maxsize=4)
def _meta_model(folder: str, config_mtime_ns: int) -> Any:
    """The model of `folder` built on the meta device (its modules and parameter shapes, no memory for weights);
    cached while its config.json is unchanged (the editor validates on every change)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
