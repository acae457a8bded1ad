"""The hardware probe: which cores this process may run on, how much memory the machine has, which GPUs it sees.

Cheap where it can be: `gpu_devices` imports torch only when an NVIDIA driver is present to find; `cuda_available`
and `visible_gpus` import torch (lazily), for the processes that will use it anyway.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

NVIDIA_DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/dev/nvidiactl"))


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int


def usable_core_ids() -> list[int]:
    """The cores this process may run on (its CPU affinity), in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on."""
    return len(usable_core_ids())


def usable_core_list() -> str:
    """The cores this process may run on as a CPU list, e.g. `0-3,6` (the form of `taskset -c` and of vLLM's
    `VLLM_CPU_OMP_THREADS_BIND`)."""
    cores = usable_core_ids()
    ranges: list[str] = []
    start = previous = cores[0]
    for core in cores[1:] + [None]:
        if core is not None and core == previous + 1:
            previous = core
            continue
        ranges.append(f"{start}-{previous}" if previous > start else str(start))
        if core is not None:
            start = previous = core
    return ",".join(ranges)


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


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (imports torch, lazily)."""
    import torch

    return bool(torch.cuda.is_available())


def visible_gpus() -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs); [] without CUDA."""
    if not cuda_available():
        return []
    import torch

    count = torch.cuda.device_count()
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[:count] if named else [str(i) for i in range(count)]


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
