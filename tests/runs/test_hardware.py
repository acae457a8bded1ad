"""The hardware probe: cores as a CPU list, memory, and the GPUs this process sees (a stand-in torch for CUDA)."""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType, SimpleNamespace

import pytest

from prime_lab.runs import hardware


def test_the_core_list_names_each_usable_core_once_in_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "usable_core_ids", lambda: [0, 1, 2, 3, 6, 8, 9])
    assert hardware.usable_core_list() == "0-3,6,8-9"
    monkeypatch.setattr(hardware, "usable_core_ids", lambda: [5])
    assert hardware.usable_core_list() == "5"


def test_the_core_list_of_this_process_is_its_affinity() -> None:
    listed = {core for part in hardware.usable_core_list().split(",")
              for core in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
    assert sorted(listed) == hardware.usable_core_ids() and len(listed) == hardware.usable_cores()
    if hasattr(os, "sched_getaffinity"):
        assert listed == os.sched_getaffinity(0)


def test_memory_is_total_then_available() -> None:
    total, available = hardware.memory_bytes()
    assert total is not None and total > 2**28
    assert available is None or 0 < available <= total


def _torch_with_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> SimpleNamespace:
    cuda = SimpleNamespace(is_available=lambda: count > 0, device_count=lambda: count)
    torch = ModuleType("torch")
    torch.__spec__ = ModuleSpec("torch", None)
    vars(torch).update(cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return cuda


def test_visible_gpus_are_named_as_cuda_visible_devices_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    _torch_with_gpus(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.cuda_available() and hardware.visible_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb,GPU-cc")  # torch sees only two of them
    assert hardware.visible_gpus() == ["GPU-aa", "GPU-bb"]


def test_no_cuda_no_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _torch_with_gpus(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert not hardware.cuda_available() and hardware.visible_gpus() == []
