"""Which GPUs of this machine each of a run's processes gets: the sampler servers first, then the trainer.

`plan_gpus` is pure. From the GPUs this process sees (`runs.hardware.visible_gpus`) and the config's `num_gpus`
(default: all of them), `[inference]` tensor_parallel_size, data_parallel_size and num_servers, and `[trainer]`
nproc_per_node, it gives each local sampler server tensor_parallel_size x data_parallel_size GPUs (vLLM's engines
behind one server; the built-in server takes one) and the trainer the next nproc_per_node. Unset,
data_parallel_size fills what num_gpus leaves after the trainer; unset num_gpus, it is 1. GPUs are positions among
the visible ones (CUDA_VISIBLE_DEVICES applies); `Placement.cuda_env` turns them into a child's
CUDA_VISIBLE_DEVICES. On a CPU-only machine (or with `num_gpus = 0`) the plan is "no GPUs" and nothing is checked.

One GPU (or `num_gpus = 1`) with one sampler server on one GPU and one trainer process: they share it (`shared`), as
prime-rl once allowed and TRL's colocate mode does. The side engines (`SIDE_ROLES`: a local distillation teacher, a
local `[judge]`) run on one GPU each (`side_gpus`): the GPUs the plan leaves idle, one each in turn (two on one
where there are fewer idle GPUs than side engines), else beside the process on the fewest GPUs, a sampler server
before the trainer (an external sampler: the trainer). A card's memory is then split (`child_devices`): the vLLM
engines on it (a sampler server, the side engines) share 0.9 of it (vLLM's default for an engine alone), less the
half the trainer keeps of a card it shares; each gets its part as its `gpu_memory_utilization` (one for all of a
server's GPUs, as vLLM takes it). `[inference] gpu_memory_utilization` sets the samplers' part, `[teacher]` and
`[judge] gpu_memory_utilization` a side engine's; an engine left unset gets what the others leave. Where the card's
memory and the models' sizes are known (`model_size`: the weights from the folder's safetensors headers, the KV
cache of a token from its config.json), the unset engines split it by their needs: each first its weights, one
sequence's KV cache and vLLM's own allowance (`EngineNeed`), then an even part of what is left; else evenly. Before
anything starts, an engine whose need is more than its part, or parts that with the trainer's add up past the card,
fail the plan with the numbers (`PlacementError`).

On a shared card the sampler boots after the trainer has its weights there (`sampler_waits_for_trainer`: vLLM sizes
its KV cache from the memory free on the whole device while it profiles, so the trainer must not move meanwhile),
and the trainer sizes its rows from the memory left free once the sampler has started (trainer/attention.py).
`idle_gpus_note` says which visible GPUs a plan leaves idle and the settings that would use them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

CARD_BUDGET = 0.9  # of a GPU's memory, for the vLLM engines on it (vLLM's own default for an engine alone)
TRAINER_SHARE = 0.5  # of a GPU the trainer keeps when engines share it: RL on a 0.6B model, 64 x 2,048 tokens,
# peaked at 31 GiB of an 80 GiB H100 compiled (shared/notes/one-gpu.md)
GIB = 2**30
ENGINE_OVERHEAD_BYTES = 2 * GIB  # what a vLLM engine takes beside its weights and KV cache (its profiling run's
# activations, CUDA graphs, the CUDA context, cuBLAS and NCCL workspaces): an allowance, not a measurement


class PlacementError(ValueError):
    """The GPUs do not suffice for the configured processes; the message names the fields and what to do."""


@dataclass(frozen=True)
class Placement:
    sampler_gpus: list[list[int]]  # per local sampler server (none: an external sampler); [] each without GPUs
    trainer_gpus: list[int]
    data_parallel_size: int  # vLLM engines behind each sampler server
    devices: tuple[str, ...] = field(default=())  # the visible GPUs, as CUDA_VISIBLE_DEVICES names them
    shared: bool = False  # one sampler server and the trainer on the same GPU
    side_gpus: dict[str, list[int]] = field(default_factory=dict)  # each local side engine's GPU ([]: it has none)

    def cuda_env(self, gpus: Sequence[int]) -> dict[str, str]:
        """The CUDA_VISIBLE_DEVICES a process placed on `gpus` gets ({} without GPUs: leave it alone)."""
        return {"CUDA_VISIBLE_DEVICES": self.names(gpus)} if gpus else {}

    def names(self, gpus: Sequence[int]) -> str:
        return ",".join(self.devices[i] for i in gpus)

    def where(self, gpus: Sequence[int]) -> str:
        """`gpus` as a log line names them: "GPU 0", "GPUs 0,1"."""
        return f"GPU{'s' if len(gpus) > 1 else ''} {self.names(gpus)}"

    def idle(self, limit: int | None = None) -> list[int]:
        """The visible GPUs (the first `limit` of them) that no process of the plan uses."""
        used = set(self.used())
        return [g for g in range(len(self.devices) if limit is None else min(limit, len(self.devices)))
                if g not in used]

    def used(self) -> list[int]:
        """The GPUs some process of the plan runs on, in order."""
        sides = {g for gpus in self.side_gpus.values() for g in gpus}
        return sorted({g for gpus in self.sampler_gpus for g in gpus} | set(self.trainer_gpus) | sides)

    def describe(self, roles: dict[str, list[int]]) -> str:
        """The plan as the launcher logs it: `roles` maps each local process (sampler servers, side engines, the
        trainer) to its GPUs; processes on the same GPUs are said to share them, one on some of another's GPUs to be
        beside it."""
        groups: dict[tuple[int, ...], list[str]] = {}
        for role, gpus in roles.items():
            groups.setdefault(tuple(gpus), []).append(role)

        def who(members: list[str]) -> str:
            return members[0] if len(members) == 1 else ", ".join(members[:-1]) + " and " + members[-1]

        parts = []
        for key, members in groups.items():
            names = self.names(key)
            where = "GPU" + ("s " if "," in names else " ") + names if names else "no GPU (CPU)"
            beside = [who(others) for wider, others in groups.items() if key and set(key) < set(wider)]
            parts.append(f"{who(members)} {'share' if len(members) > 1 else 'on'} {where}"
                         + "".join(f", beside the {b}" for b in beside))
        return "; ".join(parts)


@dataclass(frozen=True)
class ChildDevices:
    """What one local process of a run gets from the placement."""

    gpus: list[int]
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES (nothing without GPUs), and the trainer's allocator setting
    gpu_memory_utilization: float | None = None  # a vLLM engine's share of its GPUs (None: the trainer; no GPUs)


# What an engine needs ---------------------------------------------------------------------------------------------
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2,
                     "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # served in the engine's dtype; others (quantised) as stored


def dtype_bytes(dtype: str | None) -> int:
    """Bytes of a served weight: float32 4, else 2 (`auto` is bfloat16 on a GPU, inference/vllm.py)."""
    return 4 if dtype == "float32" else 2


@dataclass(frozen=True)
class EngineNeed:
    """The least a vLLM engine needs of each of its GPUs: its weights and the KV cache of one sequence of `tokens`
    (split over tensor_parallel_size GPUs), and vLLM's own allowance."""

    model: str
    weights_bytes: int
    kv_bytes: int
    tokens: int
    overhead_bytes: int = ENGINE_OVERHEAD_BYTES

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    def describe(self) -> str:
        return (f"{gib(self.total)} GiB (weights {gib(self.weights_bytes)} GiB + the KV cache of one "
                f"{self.tokens:,}-token sequence {gib(self.kv_bytes)} GiB + ~{gib(self.overhead_bytes)} GiB for "
                "vLLM itself)")


@dataclass(frozen=True)
class ModelSize:
    """What serving a model costs, from its folder: the weights in the serving dtype, and the KV cache of a token."""

    name: str
    weights_bytes: int
    kv_bytes_per_token: int
    context: int | None  # the model's own context length (max_position_embeddings)

    def need(self, tokens: int, tensor_parallel_size: int = 1) -> EngineNeed:
        """An engine serving this model with room for one sequence of `tokens` (at most the model's context)."""
        tokens = min(tokens, self.context) if self.context else tokens
        return EngineNeed(self.name, math.ceil(self.weights_bytes / tensor_parallel_size),
                          math.ceil(self.kv_bytes_per_token * tokens / tensor_parallel_size), tokens)


def safetensors_header(path: Path) -> dict[str, object]:
    """The JSON header of a .safetensors file (its first 8 bytes give the header's length): nothing else is read."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return header if isinstance(header, dict) else {}


def model_size(folder: Path, dtype: str | None = None) -> ModelSize:
    """The ModelSize of a model folder served in `dtype` ([inference] dtype): the weights counted from the
    safetensors headers (floats at the serving dtype's width, quantised tensors as stored), the KV cache from
    config.json (2 x layers x KV heads x head width x the dtype's bytes a token). What cannot be read counts 0."""
    width = dtype_bytes(dtype)
    weights = 0
    for path in sorted(folder.glob("*.safetensors")):
        try:
            header = safetensors_header(path)
        except (OSError, ValueError, struct.error):
            continue
        for name, tensor in header.items():
            if name == "__metadata__" or not isinstance(tensor, dict):
                continue
            numel = math.prod(int(d) for d in tensor.get("shape", []))
            kind = str(tensor.get("dtype", ""))
            weights += numel * (width if kind in FLOAT_DTYPES else SAFETENSORS_BYTES.get(kind, width))
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers, heads = int(text.get("num_hidden_layers") or 0), int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size") or 0) // heads if heads else 0))
    context = text.get("max_position_embeddings")
    return ModelSize(folder.name, weights, 2 * layers * kv_heads * head_dim * width,
                     int(context) if isinstance(context, int) else None)


def gib(value: float) -> str:
    """Bytes as GiB with one decimal, as the messages give them."""
    return f"{value / GIB:.1f}"


# Who gets what ---------------------------------------------------------------------------------------------------
SIDE_ROLES = ("teacher", "judge")  # engines a run starts beside its samplers, one GPU each, each its own [ROLE] table


def sampler_role(index: int) -> str:
    """The role (and log name) of local sampler server `index`: `inference`, `inference-2`, ..."""
    return "inference" if index == 0 else f"inference-{index + 1}"


def share_setting(role: str) -> str:
    """The setting that gives the vLLM engine of `role` its share of a GPU."""
    return f"[{role if role in SIDE_ROLES else 'inference'}] gpu_memory_utilization"


def child_devices(placement: Placement, *, memory_override: float | None = None,
                  side_memory: Mapping[str, float | None] | None = None, cards: Sequence[int] = (),
                  needs: Mapping[str, EngineNeed] | None = None,
                  environ: dict[str, str] | None = None) -> dict[str, ChildDevices]:
    """Each local process's devices, by role: the sampler servers (`sampler_role`), the side engines (each on its
    GPU, `Placement.side_gpus`) and the `trainer`. The engines that share a GPU get `split_card`'s shares of it
    (`memory_override`: [inference] gpu_memory_utilization, `side_memory`: [teacher]'s and [judge]'s by role),
    checked by `check_card` against `cards` (each visible GPU's bytes; () when unknown) and the vLLM engines'
    `needs` by role; a server's share is one for all of its GPUs, as vLLM takes it. The trainer on a GPU gets
    PyTorch's expandable segments (less fragmentation as row lengths vary; prime-rl sets it too) unless `environ`
    (default: this process's) sets the allocator already. Raises PlacementError when the engines do not fit."""
    environ = dict(os.environ) if environ is None else environ
    needs, side_memory = needs or {}, side_memory or {}
    engines = {sampler_role(i): gpus for i, gpus in enumerate(placement.sampler_gpus)}
    sides = placement.side_gpus
    # a server and the side engines on one of its GPUs; then the side engines on a GPU of their own, by GPU
    groups = [[role, *(s for s, on in sides.items() if set(on) & set(gpus))] for role, gpus in engines.items()]
    placed = {role for roles in groups for role in roles}
    for side, gpus in sides.items():
        if side not in placed:
            groups.append([s for s, on in sides.items() if on == gpus and s not in placed])
            placed.update(groups[-1])
    engines.update(sides)
    plan: dict[str, ChildDevices] = {}
    for roles in groups:
        gpus = sorted({g for role in roles for g in engines[role]})
        if not gpus:  # vLLM's CPU build sizes its cache in GiB
            plan.update({role: ChildDevices([], {}) for role in roles})
            continue
        shared = sorted(set.intersection(*(set(engines[role]) for role in roles))) or gpus  # the card they split
        with_trainer = bool(set(gpus) & set(placement.trainer_gpus))
        card = min(cards[g] for g in gpus) if len(cards) == len(placement.devices) else None
        wanted = {role: side_memory.get(role) if role in sides else memory_override for role in roles}
        shares = split_card(roles, wanted, with_trainer=with_trainer, card=card, needs=needs,
                            where=placement.where(shared))
        if card is not None:
            check_card(placement.where(shared), card, shares, needs, with_trainer=with_trainer)
        plan.update({role: ChildDevices(list(engines[role]), placement.cuda_env(engines[role]), shares[role])
                     for role in roles})
    trainer_env = placement.cuda_env(placement.trainer_gpus)
    if placement.trainer_gpus and "PYTORCH_CUDA_ALLOC_CONF" not in environ:
        trainer_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    plan["trainer"] = ChildDevices(list(placement.trainer_gpus), trainer_env)
    return plan


def split_card(roles: Sequence[str], wanted: Mapping[str, float | None], *, with_trainer: bool,
               card: int | None = None, needs: Mapping[str, EngineNeed] | None = None,
               where: str = "the GPU") -> dict[str, float]:
    """The gpu_memory_utilization of each engine in `roles` on one GPU: what `wanted` sets, and for the others
    the room that leaves of CARD_BUDGET (less TRAINER_SHARE `with_trainer`), split by their `needs` where the
    `card`'s bytes and every such need are known (each its need, then an even part of the rest), else evenly.
    Shares are rounded down to hundredths. Raises PlacementError when the set shares leave the others nothing."""
    needs = needs or {}
    shares = {role: float(share) for role, share in wanted.items() if share is not None}
    unset = [role for role in roles if role not in shares]
    if not unset:
        return shares
    room = CARD_BUDGET - (TRAINER_SHARE if with_trainer else 0.0) - sum(shares.values())
    if room < 0.01:
        given = " and ".join(f"{share_setting(role)} = {share:g}" for role, share in shares.items())
        trainer = f", less the trainer's {TRAINER_SHARE:g}" if with_trainer else ""
        raise PlacementError(f"{given} leave{'s' * (len(shares) == 1)} nothing of {where} for the "
                             f"{' and '.join(label(r) for r in unset)} (vLLM's engines share {CARD_BUDGET:g} of a "
                             f"card{trainer}): lower it, or set "
                             f"{' and '.join(dict.fromkeys(share_setting(r) for r in unset))} too")
    floors = {role: needs[role].total / card for role in unset if role in needs} if card else {}
    spare = room - sum(floors.values())
    by_need = len(floors) == len(unset) and spare >= 0
    for role in unset:
        share = floors[role] + spare / len(unset) if by_need else room / len(unset)
        shares[role] = math.floor(share * 100 + 1e-6) / 100
    return shares


def label(role: str, need: EngineNeed | None = None) -> str:
    """A process as the messages name it: "sampler", "sampler 2", "teacher (Qwen3-8B)"."""
    name = ("sampler " + role.partition("-")[2]).strip() if role.startswith("inference") else role
    return f"{name} ({need.model})" if need is not None else name


def check_card(where: str, card: int, shares: Mapping[str, float], needs: Mapping[str, EngineNeed], *,
               with_trainer: bool) -> None:
    """Raise PlacementError, with the numbers, when a vLLM engine on this GPU (those with `needs`) needs more than
    its share, or when their shares and the trainer's add up past the card (vLLM refuses to start with less free
    than its share)."""
    engines = {role: share for role, share in shares.items() if role in needs}
    trainer = TRAINER_SHARE if with_trainer else 0.0

    def parts(leave: str = "") -> str:
        items = [f"{label(r)} {s:g} ({gib(s * card)} GiB)" for r, s in engines.items() if r != leave]
        items += [f"the trainer {trainer:g} ({gib(trainer * card)} GiB)"] if trainer else []
        return ", ".join(items)

    for role, share in engines.items():
        need = needs[role]
        if share * card >= need.total:
            continue
        others = parts(leave=role)
        room = 1.0 - trainer - sum(s for r, s in engines.items() if r != role)
        hint = (f"Set {share_setting(role)} to at least {math.ceil(need.total / card * 100) / 100:g}"
                if room * card >= need.total else
                f"All that is left of the card beside {'them' if others else 'it'} is {gib(room * card)} GiB")
        moves = " (with a second GPU the trainer moves to it)" if trainer else ""
        elsewhere = (f", serve the {role} elsewhere ([{role}.client] base_url) or leave it a GPU of its own (one "
                     f"the run leaves idle is the {role}'s)" if role in SIDE_ROLES
                     else f", or give the sampler a GPU of its own{moves}" if moves else "")
        length = "[judge.sampling] max_tokens or [inference] max_model_len" if role == "judge" \
            else "[inference] max_model_len"
        raise PlacementError(f"the {label(role, need)} does not fit {where} ({gib(card)} GiB): it needs "
                             f"{need.describe()}, but its share is {share:g} of the card, {gib(share * card)} GiB"
                             + (f" (beside it: {others})" if others else "") + f". {hint}; lower {length}, use a "
                             f"smaller model{elsewhere}")
    total = sum(engines.values()) + trainer
    if engines and total > 1.0 + 1e-9:
        raise PlacementError(f"the shares of {where} add up past the card: {parts()} = {total:g} of it "
                             f"({gib(total * card)} GiB of {gib(card)} GiB); vLLM will not start with less free than "
                             "its share. Lower " + " or ".join(dict.fromkeys(share_setting(r) for r in engines)))


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
        settings = list(dict.fromkeys(share_setting(r) for r in vllm_roles if r in plan))
        line += (f"; vLLM's gpu_memory_utilization: {', '.join(shares)} ({' and '.join(settings)} "
                 f"set{'s it' if len(settings) == 1 else ' them'})")
    return line


def describe_memory(placement: Placement, plan: dict[str, ChildDevices], cards: Sequence[int],
                    needs: Mapping[str, EngineNeed]) -> list[str]:
    """A log line for each GPU that vLLM engines with known `needs` share with another process: the card, each
    share in GiB with what that engine needs, and the trainer's part."""
    lines: list[str] = []
    if len(cards) != len(placement.devices):
        return lines
    trainer = set(plan["trainer"].gpus) if "trainer" in plan else set()
    for gpu, card in enumerate(cards):
        roles = [role for role, child in plan.items() if role != "trainer" and gpu in child.gpus]
        engines = [r for r in roles if r in needs and plan[r].gpu_memory_utilization is not None]
        with_trainer = gpu in trainer
        if not engines or (len(roles) < 2 and not with_trainer):
            continue
        parts = [f"{label(r, needs[r])} {plan[r].gpu_memory_utilization:g} = "
                 f"{gib((plan[r].gpu_memory_utilization or 0) * card)} GiB (needs {gib(needs[r].total)})"
                 for r in engines]
        if with_trainer:
            parts.append(f"the trainer keeps {TRAINER_SHARE:g} = {gib(TRAINER_SHARE * card)} GiB")
        lines.append(f"memory of {placement.where([gpu])} ({gib(card)} GiB): {'; '.join(parts)}")
    return lines


def sampler_waits_for_trainer(plan: Mapping[str, ChildDevices], vllm_roles: Sequence[str]) -> bool:
    """Whether the samplers and the side engines (a local teacher, a local judge) start only once the trainer has
    its weights on the card: when a vLLM engine shares a GPU with the trainer. vLLM sizes its KV cache from what the
    whole device has free while it profiles, so a trainer loading meanwhile would take its memory from the sampler
    (or stop it with "Error in memory profiling"). The built-in server takes what it needs as it goes; on a CPU all
    boot side by side."""
    trainer = set(plan["trainer"].gpus) if "trainer" in plan else set()
    return any(set(plan[role].gpus) & trainer for role in vllm_roles if role in plan)


def idle_gpus_note(placement: Placement, *, backend: str, num_gpus: int | None = None) -> str | None:
    """One line when the plan leaves some of the GPUs it may use idle (all visible ones, or the first `num_gpus`):
    which, and the settings that would put them to work; None when none is."""
    idle = placement.idle(num_gpus)
    if not idle:
        return None
    total = len(placement.devices) if num_gpus is None else min(num_gpus, len(placement.devices))
    used = placement.used()
    if backend == "vllm":
        fill = (f"num_gpus = {total} (vLLM's data_parallel_size then fills what the trainer leaves)"
                if num_gpus is None else "[inference] data_parallel_size (or tensor_parallel_size)")
        use = f"{fill}, or [trainer] nproc_per_node"
    elif backend == "builtin":
        use = "[inference] num_servers (one GPU each), or [trainer] nproc_per_node"
    else:
        use = "[trainer] nproc_per_node"
    return (f"{len(idle)} of {total} GPUs idle ({placement.where(idle)}): this run uses "
            f"{placement.where(used) if used else 'none'}; {use} would use them")


def side_gpus(sampler_gpus: Sequence[Sequence[int]], trainer_gpus: Sequence[int], total: int,
              roles: Sequence[str]) -> dict[str, list[int]]:
    """The one GPU each side engine in `roles` runs on (each is started as one engine on one GPU): the GPUs of the
    `total` that no other process uses, one each in turn (with fewer of them than engines, some share one and split
    it), else the first GPU of the process on the fewest GPUs, a sampler server before the trainer: vLLM takes one
    gpu_memory_utilization for all of a server's GPUs, so an engine beside a server on several lowers its share on
    each of them, and the trainer's ranks plan their rows from the least free memory among them."""
    used = {g for gpus in sampler_gpus for g in gpus} | set(trainer_gpus)
    idle = [g for g in range(total) if g not in used]
    if idle:
        return {role: [idle[i % len(idle)]] for i, role in enumerate(roles)}
    beside = min((gpus for gpus in [*sampler_gpus, trainer_gpus] if gpus), key=len)[0]
    return {role: [beside] for role in roles}


def plan_gpus(devices: Sequence[str], *, backend: str, num_gpus: int | None = None, tensor_parallel_size: int = 1,
              data_parallel_size: int | None = None, num_servers: int = 1, nproc_per_node: int = 1,
              trainer_on_gpu: bool = True, sides: Sequence[str] = ()) -> Placement:
    """The GPUs of each local sampler server (`backend` "builtin" or "vllm"; "external" starts none), of the
    trainer's processes and of the local side engines by role (`sides`, of SIDE_ROLES: `side_gpus`). Raises
    PlacementError when they do not fit."""
    placement = _plan_gpus(devices, backend=backend, num_gpus=num_gpus, tensor_parallel_size=tensor_parallel_size,
                           data_parallel_size=data_parallel_size, num_servers=num_servers,
                           nproc_per_node=nproc_per_node, trainer_on_gpu=trainer_on_gpu)
    if not sides:
        return placement
    total = len(devices) if num_gpus is None else num_gpus
    gpus = side_gpus(placement.sampler_gpus, placement.trainer_gpus, total, sides) if placement.devices \
        else {role: [] for role in sides}
    return replace(placement, side_gpus=gpus)


def _plan_gpus(devices: Sequence[str], *, backend: str, num_gpus: int | None, tensor_parallel_size: int,
               data_parallel_size: int | None, num_servers: int, nproc_per_node: int,
               trainer_on_gpu: bool) -> Placement:
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
