"""The models a server serves: its base model and LoRA adapters, each adapter merged into its own weights.

A LoRA adapter is merged (peft `merge_and_unload(safe_merge=True)`) into a clone of the base model whose
parameters share the base's storage; the safe merge gives each adapted layer a new weight tensor and leaves the
others shared. Generation through an adapter then costs what generation through the base costs, and memory
grows only by the adapted layers. An adapter replaced in place (`load_inplace`) gets a new `ServedModel` (new
`key`) under the same name, and `current` resolves the old one to it: requests already generating continue on the
new weights from their next token (as vLLM's in-place load does: the running batch keeps its rows and its KV
cache), so an RL sampler never drains its batch to switch policies. An unloaded adapter's running requests finish
on the weights they have.

Full weights (a trainer's full fine-tuning) replace the base model's in place (`update_base_weights`): read and
checked off the engine thread, copied between two forward passes, so running requests continue on them. Every load
is logged with its path and how long it took, so the server's log says when each policy version arrived.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from prime_lab.inference.builtin.errors import APIError, ModelNotServedError

log = logging.getLogger(__name__)
_keys = itertools.count()


@dataclass(frozen=True)
class ServedModel:
    """A name a request can ask for, and the torch module that answers it."""

    name: str
    module: Any
    root: str
    parent: str | None = None
    key: int = field(default_factory=lambda: next(_keys))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None


def merged_adapter_model(base_module: Any, adapter_path: Path) -> Any:
    """A copy of `base_module` with the LoRA adapter at `adapter_path` merged into it (base left untouched)."""
    import copy

    import torch
    from peft import PeftModel

    shared: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach(), requires_grad=False) for p in base_module.parameters()
    }
    shared.update({id(b): b for b in base_module.buffers()})
    clone = copy.deepcopy(base_module, shared)
    with torch.no_grad():
        # low_cpu_mem_usage: the LoRA layers are made on the meta device and take the adapter's tensors, never a
        # random initialisation (no draw from a generator that a graph capture may hold)
        merged = PeftModel.from_pretrained(
            clone, str(adapter_path), is_trainable=False, low_cpu_mem_usage=True
        ).merge_and_unload(safe_merge=True)
    return merged.eval()


class ModelRegistry:
    """Base model and adapters by name; safe to use from the HTTP thread and the engine thread."""

    def __init__(self, base: ServedModel, prepare: Callable[[Any], Any] | None = None,
                 device_lock: threading.Lock | None = None) -> None:
        self.base = base
        self.prepare = prepare  # applied to each merged adapter model (e.g. faster CPU kernels)
        # held while an adapter is merged on the device; the engine's graph capture takes it too (graph_decode.py)
        self.device_lock = device_lock or threading.Lock()
        self._adapters: dict[str, ServedModel] = {}
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()

    def get(self, name: str | None) -> ServedModel:
        if name is None or name == self.base.name:
            return self.base
        with self._lock:
            adapter = self._adapters.get(name)
        if adapter is None:
            raise ModelNotServedError(name)
        return adapter

    def current(self, model: ServedModel) -> ServedModel:
        """What now answers for `model`: its in-place replacement if it was replaced, else itself."""
        if not model.is_adapter:
            return model
        with self._lock:
            return self._adapters.get(model.name, model)

    def served(self) -> list[ServedModel]:
        with self._lock:
            return [self.base, *self._adapters.values()]

    def load_adapter(self, name: str, path: str, load_inplace: bool = False) -> str:
        """Merge and register an adapter (slow: run it off the event loop). Returns vLLM's success message."""
        if not name or not path:
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput")
        if name == self.base.name:
            raise APIError(f"The lora adapter '{name}' conflicts with a served base model.", type="InvalidUserInput")
        with self._load_lock:
            with self._lock:
                exists = name in self._adapters
            if exists and not load_inplace:
                raise APIError(
                    f"The lora adapter '{name}' has already been loaded. "
                    "If you want to load the adapter in place, set 'load_inplace' to True.",
                    type="InvalidUserInput",
                )
            adapter_dir = Path(path).expanduser()
            t0 = time.perf_counter()
            if not (adapter_dir / "adapter_config.json").is_file():
                raise APIError(f"Loading lora {name} failed: No adapter found for {path}", HTTPStatus.NOT_FOUND)
            try:
                with self.device_lock:
                    module = merged_adapter_model(self.base.module, adapter_dir)
                    if self.prepare is not None:
                        module = self.prepare(module)
            except Exception as error:  # peft raises many kinds for a bad adapter; the client needs the message
                raise APIError(f"Loading lora {name} failed: {type(error).__name__}: {error}") from error
            with self._lock:
                self._adapters[name] = ServedModel(name=name, module=module, root=path, parent=self.base.name)
            log.info("loaded LoRA adapter %r from %s%s in %.2f s", name, path, " in place" if exists else "",
                     time.perf_counter() - t0)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, name: str) -> str:
        if not name:
            raise APIError("'lora_name' needs to be provided to unload a LoRA adapter.", type="InvalidUserInput")
        with self._lock:
            if self._adapters.pop(name, None) is None:
                raise APIError(f"The lora adapter '{name}' cannot be found.", HTTPStatus.NOT_FOUND)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def update_base_weights(
        self, path: str, between_steps: Callable[[Callable[[], Any]], Future[Any]]
    ) -> dict[str, Any]:
        """Replace every weight of the base model with those of the model folder `path` (HF-named safetensors), in
        place; the copy runs through `between_steps` (the engine's: no forward pass meanwhile). Slow: run it off the
        event loop. Refused while adapters are loaded (they were merged into the old weights)."""
        if not path:
            raise APIError("'args' must hold the folder of the new weights", type="InvalidUserInput")
        t0 = time.perf_counter()
        with self._load_lock:
            with self._lock:
                adapters = sorted(self._adapters)
            if adapters:
                raise APIError(
                    f"cannot replace the base weights while LoRA adapters are loaded ({', '.join(adapters)}: they "
                    "are merged into the current weights); unload them first",
                    type="InvalidUserInput",
                )
            pairs = base_weight_pairs(self.base.module, Path(path).expanduser())
            copied = between_steps(lambda: copy_weights(pairs)).result()
            seconds = time.perf_counter() - t0
            log.info("loaded full weights from %s (%d tensors) in %.2f s", path, copied, seconds)
        return {"tensors": copied, "seconds": seconds}


def base_weight_pairs(module: Any, folder: Path) -> list[tuple[Any, Any]]:
    """(parameter, new tensor) for every tensor in `folder`, checked against `module`: an APIError names
    an unknown tensor, a shape that differs, or a parameter the folder leaves out (tied ones excepted)."""
    from prime_lab.inference.weights import read_weights

    targets = dict(module.named_parameters(remove_duplicate=False))
    try:
        new = dict(read_weights(folder))
    except (OSError, ValueError) as error:  # no safetensors, an unreadable file
        raise APIError(f"Loading weights from {folder} failed: {error}", HTTPStatus.NOT_FOUND) from error
    if not set(new) <= set(targets) and (folder / "config.json").is_file():
        new = loaded_weights(module, folder)
    unknown = sorted(set(new) - set(targets))
    if unknown:
        raise APIError(
            f"Loading weights from {folder} failed: {len(unknown)} tensors are not in the served model "
            f"(first: {unknown[0]})"
        )
    wrong = [n for n, t in new.items() if tuple(t.shape) != tuple(targets[n].shape)]
    if wrong:
        raise APIError(
            f"Loading weights from {folder} failed: {wrong[0]} has shape {tuple(new[wrong[0]].shape)}, "
            f"the served model's {tuple(targets[wrong[0]].shape)}"
        )
    covered = {id(targets[n]) for n in new}
    missing = sorted(n for n, p in targets.items() if id(p) not in covered)
    if missing:
        raise APIError(
            f"Loading weights from {folder} failed: {len(missing)} parameters are missing (first: {missing[0]})"
        )
    return [(targets[n], t) for n, t in new.items()]


def loaded_weights(module: Any, folder: Path) -> dict[str, Any]:
    """The weights of the model folder `folder` under `module`'s parameter names, loaded by transformers as the
    served model was. A checkpoint's names can differ from the loaded model's: transformers 5 fuses a
    Mixture-of-Experts layer's experts on load (`experts.0.gate_proj.weight`, ... -> `experts.gate_up_proj`) and
    `save_pretrained` writes them back one expert at a time, as a full fine-tuning trainer publishes them."""
    try:
        loaded, info = type(module).from_pretrained(folder, dtype=next(module.parameters()).dtype,
                                                    output_loading_info=True)
    except (OSError, ValueError) as error:
        raise APIError(f"Loading weights from {folder} failed: {type(error).__name__}: {error}") from error
    unknown = sorted(info["unexpected_keys"]) + sorted(info["missing_keys"])
    if unknown:  # transformers filled them in at random: the folder is not a checkpoint of this model
        raise APIError(
            f"Loading weights from {folder} failed: {len(unknown)} tensors are not in the served model or missing "
            f"from the folder (first: {unknown[0]})"
        )
    return {name: parameter.detach() for name, parameter in loaded.named_parameters(remove_duplicate=False)}


def copy_weights(pairs: list[tuple[Any, Any]]) -> int:
    import torch

    with torch.no_grad():
        for target, tensor in pairs:
            target.copy_(tensor)
    return len(pairs)
