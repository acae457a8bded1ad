"""Which GPUs of this machine each of a run's processes gets: the sampler servers first, then the trainer.

`plan_gpus` is pure. From the GPUs this process sees (`runs.hardware.visible_gpus`) and the config's `num_gpus`
(default: all of them), `[inference]` tensor_parallel_size, data_parallel_size and num_servers, and `[trainer]`
nproc_per_node, it gives each local sampler server tensor_parallel_size x data_parallel_size GPUs (vLLM's engines
behind one server; the built-in server takes one) and the trainer the next nproc_per_node. Unset,
data_parallel_size fills what num_gpus leaves after the trainer; unset num_gpus, it is 1. GPUs are positions among
the visible ones (CUDA_VISIBLE_DEVICES applies); `Placement.cuda_env` turns them into a child's
CUDA_VISIBLE_DEVICES. On a CPU-only machine (or with `num_gpus = 0`) the plan is "no GPUs" and nothing is checked.

One GPU (or `num_gpus = 1`) with one sampler server on one GPU and one trainer process: they share it (`shared`),
as prime-rl once allowed and TRL's colocate mode does. A card's memory is then split: each vLLM engine on it (a
sampler server, a local teacher beside sampler 0) gets `engine_memory_fraction` of it as its
`gpu_memory_utilization` (0.9 for an engine alone, vLLM's default; the trainer keeps half of a card it shares), and
the trainer sizes its rows from the memory left free once the sampler has started (trainer/attention.py).
`[inference] gpu_memory_utilization` overrides the fraction for every engine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

CARD_BUDGET = 0.9  # of a GPU's memory, for the vLLM engines on it (vLLM's own default for an engine alone)
TRAINER_SHARE = 0.5  # of a GPU the trainer keeps when engines share it: RL on a 0.6B model, 64 x 2,048 tokens,
# peaked at 31 GiB of an 80 GiB H100 compiled (shared/notes/one-gpu.md)


class PlacementError(ValueError):
    """The GPUs do not suffice for the configured processes; the message names the fields and what to do."""


@dataclass(frozen=True)
class Placement:
    sampler_gpus: list[list[int]]  # per local sampler server (none: an external sampler); [] each without GPUs
    trainer_gpus: list[int]
    data_parallel_size: int  # vLLM engines behind each sampler server
    devices: tuple[str, ...] = field(default=())  # the visible GPUs, as CUDA_VISIBLE_DEVICES names them
    shared: bool = False  # one sampler server and the trainer on the same GPU

    def cuda_env(self, gpus: Sequence[int]) -> dict[str, str]:
        """The CUDA_VISIBLE_DEVICES a process placed on `gpus` gets ({} without GPUs: leave it alone)."""
        return {"CUDA_VISIBLE_DEVICES": self.names(gpus)} if gpus else {}

    def names(self, gpus: Sequence[int]) -> str:
        return ",".join(self.devices[i] for i in gpus)

    def engine_memory_fraction(self, gpus: Sequence[int], engines: int, override: float | None = None) -> float | None:
        """The gpu_memory_utilization of a vLLM engine placed on `gpus` beside `engines` - 1 other engines (a
        local teacher beside sampler 0): `override` when given ([inference] gpu_memory_utilization), else
        `engine_memory_fraction` of the card, with the trainer's share kept when the trainer is on it too. None
        without GPUs (vLLM's CPU build sizes its cache in GiB)."""
        if not gpus:
            return None
        if override is not None:
            return override
        return engine_memory_fraction(engines, with_trainer=bool(set(gpus) & set(self.trainer_gpus)))

    def describe(self, roles: dict[str, list[int]]) -> str:
        """The plan as the launcher logs it: `roles` maps each local process (sampler servers, a teacher, the
        trainer) to its GPUs; processes on the same GPUs are said to share them."""
        groups: dict[str, list[str]] = {}
        for role, gpus in roles.items():
            groups.setdefault(self.names(gpus) if gpus else "", []).append(role)
        parts = []
        for names, members in groups.items():
            who = members[0] if len(members) == 1 else ", ".join(members[:-1]) + " and " + members[-1]
            where = "GPU" + ("s " if "," in names else " ") + names if names else "no GPU (CPU)"
            parts.append(f"{who} {'share' if len(members) > 1 else 'on'} {where}")
        return "; ".join(parts)


@dataclass(frozen=True)
class ChildDevices:
    """What one local process of a run gets from the placement."""

    gpus: list[int]
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES (nothing without GPUs), and the trainer's allocator setting
    gpu_memory_utilization: float | None = None  # a vLLM engine's share of its GPUs (None: the trainer; no GPUs)


def sampler_role(index: int) -> str:
    """The role (and log name) of local sampler server `index`: `inference`, `inference-2`, ..."""
    return "inference" if index == 0 else f"inference-{index + 1}"


def child_devices(placement: Placement, *, local_teacher: bool = False, memory_override: float | None = None,
                  environ: dict[str, str] | None = None) -> dict[str, ChildDevices]:
    """Each local process's devices, by role: the sampler servers (`sampler_role`), a local `teacher` (beside
    sampler 0, on its GPUs) and the `trainer`. The trainer on a GPU gets PyTorch's expandable segments (less
    fragmentation as row lengths vary; prime-rl sets it too) unless `environ` (default: this process's) sets the
    allocator already."""
    environ = dict(os.environ) if environ is None else environ
    plan: dict[str, ChildDevices] = {}
    for i, gpus in enumerate(placement.sampler_gpus):
        engines = 2 if i == 0 and local_teacher else 1
        plan[sampler_role(i)] = ChildDevices(gpus, placement.cuda_env(gpus),
                                             placement.engine_memory_fraction(gpus, engines, memory_override))
    if local_teacher and placement.sampler_gpus:
        gpus = placement.sampler_gpus[0]
        plan["teacher"] = ChildDevices(gpus, placement.cuda_env(gpus),
                                       placement.engine_memory_fraction(gpus, 2, memory_override))
    trainer_env = placement.cuda_env(placement.trainer_gpus)
    if placement.trainer_gpus and "PYTORCH_CUDA_ALLOC_CONF" not in environ:
        trainer_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    plan["trainer"] = ChildDevices(list(placement.trainer_gpus), trainer_env)
    return plan


def describe_devices(placement: Placement, plan: dict[str, ChildDevices], vllm_roles: Sequence[str] = ()) -> str:
    """The launcher's log line for `plan`: which processes share which GPUs, and the share of each vLLM engine
    (`vllm_roles`) on a GPU, e.g. "GPUs: sampler and trainer share GPU 0; vLLM's gpu_memory_utilization: sampler
    0.4"."""
    servers = sum(1 for role in plan if role.startswith("inference"))
    names = {role: ("sampler" if servers == 1 else f"sampler {role.partition('-')[2] or '1'}")
             if role.startswith("inference") else role for role in plan}
    line = "GPUs: " + placement.describe({names[role]: child.gpus for role, child in plan.items()})
    shares = [f"{names[role]} {plan[role].gpu_memory_utilization:g}" for role in vllm_roles
              if role in plan and plan[role].gpu_memory_utilization is not None]
    if shares:
        line += f"; vLLM's gpu_memory_utilization: {', '.join(shares)} ([inference] gpu_memory_utilization sets it)"
    return line


def engine_memory_fraction(engines: int, *, with_trainer: bool) -> float:
    """The gpu_memory_utilization of each of `engines` vLLM engines sharing one GPU, with the trainer or without:
    0.9 for one alone, 0.45 for two, 0.4 for one beside the trainer, 0.2 for two beside it."""
    room = CARD_BUDGET - (TRAINER_SHARE if with_trainer else 0.0)
    return round(room / max(1, engines), 2)


def plan_gpus(devices: Sequence[str], *, backend: str, num_gpus: int | None = None, tensor_parallel_size: int = 1,
              data_parallel_size: int | None = None, num_servers: int = 1, nproc_per_node: int = 1,
              trainer_on_gpu: bool = True) -> Placement:
    """The GPUs of each local sampler server (`backend` "builtin" or "vllm"; "external" starts none) and of the
    trainer's processes. Raises PlacementError when they do not fit."""
    servers = 0 if backend == "external" else num_servers
    total = len(devices) if num_gpus is None else num_gpus
    if not devices or total == 0:
        return Placement([[] for _ in range(servers)], [], data_parallel_size or 1)
    if total > len(devices):
        raise PlacementError(f"num_gpus is {total}, but this machine shows {len(devices)} GPU(s) "
                             f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): lower "
                             "num_gpus, or leave it out to use every visible GPU")
    tp, trainer = tensor_parallel_size, nproc_per_node if trainer_on_gpu else 0
    if backend == "builtin":
        if tp > 1 or (data_parallel_size or 1) > 1:
            raise PlacementError("[inference].tensor_parallel_size and data_parallel_size need vLLM: the built-in "
                                 'sampler runs on one GPU per server. Set [inference] backend = "vllm", or spread '
                                 "requests over built-in servers with [inference].num_servers")
        dp, per_server = 1, 1
    else:
        if data_parallel_size is not None:
            dp = data_parallel_size
        elif num_gpus is not None and servers:
            dp = max(1, (num_gpus - trainer) // (tp * servers))
        else:
            dp = 1
        per_server = tp * dp
    need = per_server * servers + trainer
    if need > total and per_server * servers == 1 and trainer == 1:
        # one GPU for one sampler server and one trainer process: they share it
        return Placement([[0]], [0], dp, tuple(devices), shared=True)
    if need > total:
        have = f"num_gpus is {total}" if num_gpus is not None else f"this machine shows {total}"
        sampler = (f"the sampler needs [inference] tensor_parallel_size ({tp}) x data_parallel_size ({dp}) x "
                   f"num_servers ({servers}) = {per_server * servers} GPU(s)" if backend == "vllm" else
                   f"the sampler needs one GPU per server: [inference].num_servers ({servers})")
        trainer_part = f" and the trainer [trainer].nproc_per_node ({trainer}) more" if trainer else ""
        raise PlacementError(f"not enough GPUs: {sampler}{trainer_part}, {need} in all, but {have}. Lower those "
                             "settings" + (", or raise num_gpus" if num_gpus is not None and num_gpus < len(devices)
                                           else ""))
    gpus = iter(range(need))
    sampler_gpus = [[next(gpus) for _ in range(per_server)] for _ in range(servers)]
    return Placement(sampler_gpus, list(gpus), dp, tuple(devices))
