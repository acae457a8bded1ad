"""Which GPUs of this machine each of a run's processes gets: the sampler servers first, then the trainer.

`plan_gpus` is pure. From the GPUs this process sees (`runs.hardware.visible_gpus`) and the config's `num_gpus`
(default: all of them), `[inference]` tensor_parallel_size, data_parallel_size and num_servers, and `[trainer]`
nproc_per_node, it gives each local sampler server tensor_parallel_size x data_parallel_size GPUs (vLLM's engines
behind one server; the built-in server takes one) and the trainer the next nproc_per_node. Unset,
data_parallel_size fills what num_gpus leaves after the trainer; unset num_gpus, it is 1. GPUs are positions among
the visible ones (CUDA_VISIBLE_DEVICES applies); `Placement.cuda_env` turns them into a child's
CUDA_VISIBLE_DEVICES. On a CPU-only machine (or with `num_gpus = 0`) the plan is "no GPUs" and nothing is checked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field


class PlacementError(ValueError):
    """The GPUs do not suffice for the configured processes; the message names the fields and what to do."""


@dataclass(frozen=True)
class Placement:
    sampler_gpus: list[list[int]]  # per local sampler server (none: an external sampler); [] each without GPUs
    trainer_gpus: list[int]
    data_parallel_size: int  # vLLM engines behind each sampler server
    devices: tuple[str, ...] = field(default=())  # the visible GPUs, as CUDA_VISIBLE_DEVICES names them

    def cuda_env(self, gpus: Sequence[int]) -> dict[str, str]:
        """The CUDA_VISIBLE_DEVICES a process placed on `gpus` gets ({} without GPUs: leave it alone)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices[i] for i in gpus)} if gpus else {}


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
    if need > total and num_gpus is None and per_server * servers <= 1 and trainer <= 1:
        # one GPU, one sampler, one trainer process: they share it, as they always could
        return Placement([[] for _ in range(servers)], [], dp, tuple(devices))
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
