"""The trainer past one process: torch.distributed under `torchrun`, from the same config.

`[trainer] nproc_per_node` processes per machine and `nnodes` machines. The prime-rl guide's variables are per node
and, when set, win over the config (it is the same file on every node): `WORLD_SIZE` = number of nodes, `RANK` =
this node's rank, `MASTER_ADDR` / `MASTER_PORT` = node 0. The launcher maps them onto torchrun's `--nnodes`,
`--node-rank`, `--master-addr`, `--master-port` (`--standalone` on one machine without a port), and torchrun gives
each worker its own global `RANK` / `WORLD_SIZE` / `LOCAL_RANK`.

Inside the trainer (`Dist`): backend nccl on GPUs, gloo on CPU; every collective has a timeout, so a rank waiting
on a dead one fails within `PRIME_LAB_DIST_TIMEOUT_S` (default 300 s, room for rank 0 writing a large model while
the others wait; on one machine torchrun ends the other workers within a second of one exiting, and a rank whose
peer process died gets a connection error at once). Global rank 0 alone reads the orchestrator's batches and sends
them to the other ranks, and alone writes adapters, checkpoints, events and status. With LoRA (DDP) nodes other than
0 need no shared file system (rank 0 sends them the adapter to start from); FSDP writes each rank's shard into the
run's checkpoint folder, so across nodes the run directory must be on a shared file system.
While it waits for a batch it sends a heartbeat every `HEARTBEAT_S`, so waiting for the sampler never trips the
timeout. Each rank trains on its share of the packed micro-batches (`shard_rows`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prime_lab.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from prime_lab.trainer.packing import PackedRow

T = TypeVar("T")
MULTI_NODE_PORT = 29500
HEARTBEAT_S = 1.0
WAITING = "prime-lab:waiting-for-batch"
# The variables of the prime-rl guide (per node) and of torchrun (per worker) that the launcher reads and then keeps
# away from the processes that are not the trainer.
NODE_VARIABLES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class TopologyError(ValueError):
    """The distributed settings do not add up; the message names the setting."""


@dataclass(frozen=True)
class Topology:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def runs_sampler(self) -> bool:
        """Only node 0 runs the sampler and the orchestrator; the other nodes run trainer ranks."""
        return self.node_rank == 0


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise TopologyError(f"environment variable {name}={value!r} must be a whole number") from None


def topology(config: TrainerConfig, environ: Mapping[str, str] = os.environ) -> Topology:
    """The run's trainer topology: the config, with the prime-rl guide's per-node variables winning."""
    nnodes = _env_int(environ, "WORLD_SIZE", config.nnodes)
    node_rank = _env_int(environ, "RANK", config.node_rank)
    port = _env_int(environ, "MASTER_PORT", config.master_port or 0) or None
    addr = environ.get("MASTER_ADDR") or config.master_addr
    if nnodes < 1:
        raise TopologyError(f"[trainer].nnodes (or WORLD_SIZE) is {nnodes}: it must be at least 1")
    if not 0 <= node_rank < nnodes:
        raise TopologyError(f"this node's rank ([trainer].node_rank or RANK = {node_rank}) must be between 0 and "
                            f"{nnodes - 1} (nnodes or WORLD_SIZE = {nnodes})")
    if nnodes > 1 and port is None:
        port = MULTI_NODE_PORT
    return Topology(config.nproc_per_node, nnodes, node_rank, addr, port)


def torchrun_argv(topo: Topology, module: str, args: list[str]) -> list[str]:
    """`python -m` arguments that run `module` under torchrun: one worker per process of this node; a worker that
    fails ends the others (no restarts)."""
    if topo.nnodes == 1 and topo.master_port is None:
        where = ["--standalone"]
    else:
        where = ["--nnodes", str(topo.nnodes), "--node-rank", str(topo.node_rank), "--master-addr", topo.master_addr,
                 "--master-port", str(topo.master_port)]
    return ["torch.distributed.run", *where, "--nproc-per-node", str(topo.nproc_per_node), "--max-restarts", "0",
            "--monitor-interval", "0.5", "-m", module, *args]


def strategy(config: TrainerConfig, lora: bool) -> str:
    """"ddp" or "fsdp": auto is DDP for a LoRA adapter (small: each rank keeps a replica), FSDP2 for full
    fine-tuning (each rank holds a shard of the weights, gradients and optimizer state)."""
    if config.distributed != "auto":
        return config.distributed
    return "ddp" if lora else "fsdp"


def shard_rows(rows: list[PackedRow], rank: int, world_size: int) -> list[tuple[PackedRow, float]]:
    """Rank `rank`'s packed rows with their loss weights: every `world_size`-th row, then (weight 0) repeats of the
    first row until every rank has the same count: DDP reduces gradients on the last backward of each rank, and
    FSDP gathers weights on every forward, so all ranks run the same number of passes."""
    mine: list[tuple[PackedRow, float]] = [(row, 1.0) for row in rows[rank::world_size]]
    per_rank = -(-len(rows) // world_size) if rows else 0
    while rows and len(mine) < per_rank:
        mine.append((rows[0], 0.0))
    return mine


def timeout_s() -> float:
    return float(os.environ.get("PRIME_LAB_DIST_TIMEOUT_S", "300"))


class Dist:
    """This process's place in the trainer: rank, world size, device, and the few collectives the trainer uses.
    With one process every method is a no-op that returns its input."""

    def __init__(self, device: str = "cpu") -> None:
        self.rank = int(os.environ.get("RANK", "0")) if "LOCAL_RANK" in os.environ else 0
        self.world_size = int(os.environ.get("WORLD_SIZE", "1")) if "LOCAL_RANK" in os.environ else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = device
        if self.world_size > 1:
            import torch
            import torch.distributed as dist

            if device == "cuda":
                torch.cuda.set_device(self.local_rank)
                self.device = f"cuda:{self.local_rank}"
            if not dist.is_initialized():
                dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                        timeout=timedelta(seconds=timeout_s()))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str | None:
        if self.world_size == 1:
            return None
        import torch.distributed as dist

        return str(dist.get_backend())

    def share(self, obj: T) -> T:
        """Rank 0's `obj`, on every rank (the others' argument is ignored)."""
        if self.world_size == 1:
            return obj
        import torch
        import torch.distributed as dist

        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0,
                                   device=torch.device(self.device) if self.device.startswith("cuda") else None)
        return box[0]  # type: ignore[no-any-return]

    def share_folder(self, folder: Path | None) -> Path | None:
        """Rank 0's `folder` (a small one: a LoRA adapter), on every rank: the other ranks get a copy of its files
        in a temporary folder, since their machine may not have it."""
        if self.world_size == 1:
            return folder
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} \
            if self.is_main and folder is not None else None
        files = self.share(files)
        if self.is_main or files is None:
            return folder
        import tempfile

        copy = Path(tempfile.mkdtemp(prefix="prime-lab-rank-"))
        for name, data in files.items():
            (copy / name).write_bytes(data)
        return copy  # the caller removes it once loaded

    def sum(self, values: list[float]) -> list[float]:
        """`values` added up over the ranks."""
        if self.world_size == 1:
            return values
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()  # a rank that tears gloo down while another still talks to it aborts
                dist.destroy_process_group()


def exit_rank(code: int) -> None:
    """End a torchrun rank now, its output flushed. After the process group is gone, the interpreter's own shutdown
    sometimes aborts in torch's native teardown ("terminate called without an active exception", about 1 exit in
    15 on this CPU with FSDP), which would turn a finished rank into a failed one; everything the rank writes is
    written and closed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
