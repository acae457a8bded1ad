"""The policy the trainer updates: a transformers causal LM with a peft LoRA adapter (or, for full fine-tuning, the
whole model), its token logprobs, and the loss of one batch of samples computed in micro-batches (gradients
accumulate; one optimizer step per batch). Also how it runs on a GPU: compiled layers and the clock of their
compiling (`CompileClock`), and the memory a step needs (`ModelShape`, `plan_memory`: the row budget and activation
checkpointing the trainer settles on at its first batch).

torch, transformers and peft are imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prime_lab.trainer.attention import (
    CPU_ROW_TOKENS,
    default_row_tokens,
    packs_prefixes,
    row_budget,
    row_inputs,
    use_row_attention,
)
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.lm_head import DEFAULT_CHUNK_SIZE, chosen_logprobs, chunkable_head, sampled_head
from prime_lab.trainer.loss import (
    LossOutput,
    cross_entropy_loss,
    distillation_advantages,
    inside_nucleus,
    policy_loss,
    teacher_kl_sum,
)
from prime_lab.trainer.packing import pack

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from prime_lab.trainer.distributed import Dist


def pick_device(requested: str = "auto") -> str:
    from prime_lab.runs.hardware import cuda_available

    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    return requested


def pick_dtype(requested: str, device: str) -> torch.dtype:
    """The dtype a model computes in (`[trainer] dtype`): auto is bfloat16 on CUDA, float32 on the CPU."""
    import torch

    if requested == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[requested]


@dataclass(frozen=True)
class Precision:
    """The dtype a model's weights are kept in and the one its forward computes in. Full fine-tuning computing in
    bfloat16 keeps float32 master weights (and so float32 gradients and AdamW moments): AdamW's update of a bfloat16
    weight rounds to nothing below ~1/256 of the weight (a learning rate of 1e-6 never moves it). One process
    autocasts the forward to `compute` (`autocast`); FSDP2 casts the gathered weights instead
    (`shard_model`, which turns `autocast` off)."""

    params: torch.dtype
    compute: torch.dtype
    autocast: bool

    def describe(self) -> str:
        """"bfloat16 with float32 master weights", or the one dtype."""
        compute, params = (str(d).removeprefix("torch.") for d in (self.compute, self.params))
        return compute if compute == params else f"{compute} with {params} master weights"


def pick_precision(requested: str, device: str, *, trainable: bool) -> Precision:
    """`[trainer] dtype` on `device` for a fully trainable model (`trainable`) or a frozen one (the KL reference,
    LoRA's base: kept in the compute dtype). float32 is float32 throughout, as on the CPU by default."""
    import torch

    compute = pick_dtype(requested, device)
    params = torch.float32 if trainable else compute
    return Precision(params=params, compute=compute, autocast=params != compute)


PRECISION_ATTR = "prime_lab_precision"  # the Precision load_full_policy gives a model (read by `precision_of`)


def precision_of(model: Any) -> Precision | None:
    """The Precision a model was loaded with by `load_full_policy`, None for any other (LoRA: peft keeps the
    adapter's weights in float32 itself)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, PRECISION_ATTR, None)


def compute_context(model: Any) -> AbstractContextManager[Any]:
    """The context a forward of `model` runs in: autocast to its compute dtype where its weights are kept wider
    (full fine-tuning's float32 master weights on one process), else none."""
    import contextlib

    import torch

    precision = precision_of(model)
    if precision is None or not precision.autocast:
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=precision.compute)


def load_policy(model_path: Path, *, lora_r: int = 16, lora_alpha: float = 16, lora_dropout: float = 0.0,
                target_modules: list[str] | None = None, target_parameters: list[str] | None = None,
                device: str = "cpu", dtype: str = "auto", adapter_path: Path | None = None) -> Any:
    """The base model at `model_path` with a trainable LoRA adapter (fresh, or the one saved at `adapter_path`).
    `target_parameters` adapts parameters rather than modules: the fused 3-D experts of a Mixture-of-Experts model
    (trainer/lora_targets.py). A target that matches nothing is refused (ValueError), naming what the model has."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from prime_lab.trainer.lora_targets import check_targets

    torch_dtype = pick_dtype(dtype, device)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
    base.to(device)  # type: ignore[arg-type]
    base.config.use_cache = False
    if adapter_path is not None:
        return PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
    check_targets(base, target_modules or [], target_parameters or [], model_path.name)
    config = LoraConfig(r=lora_r, lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft accepts a float
                        lora_dropout=lora_dropout, target_modules=target_modules or None,
                        target_parameters=target_parameters or None, task_type="CAUSAL_LM", bias="none")
    return get_peft_model(base, config)


def load_full_policy(model_path: Path, *, device: str = "cpu", dtype: str = "auto", trainable: bool = True) -> Any:
    """The model at `model_path` with every parameter trainable (full fine-tuning), or frozen in eval mode (the
    reference policy of the KL penalty). Tied weights (an LM head tied to the embeddings) stay one parameter.
    Trainable weights are float32 whatever the compute dtype (`pick_precision`: master weights); the forwards in
    this module run under `compute_context`."""
    from transformers import AutoModelForCausalLM

    precision = pick_precision(dtype, device, trainable=trainable)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=precision.params)
    model.to(device)  # type: ignore[arg-type]
    model.config.use_cache = False
    model.requires_grad_(trainable)
    setattr(model, PRECISION_ATTR, precision)
    return model if trainable else model.eval()


def peak_memory_gib(device: str) -> float:
    """The most memory this process has held: on a GPU, its tensors' peak on `device`; on the CPU, its peak
    resident size (model loading included)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def enable_activation_checkpointing(model: Any) -> None:
    """Each decoder layer's activations are recomputed in the backward pass rather than kept (transformers'
    gradient checkpointing, non-reentrant: works under DDP and FSDP2 and with a frozen base under LoRA). It acts
    while the model is in training mode, as the trainer's step puts it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"[trainer].activation_checkpointing: {type(base).__name__} does not support it in "
                         "transformers; set it to false")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers (the modules transformers keeps whole: `_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    return [module for module in base.modules() if type(module).__name__ in names]


def compiles(setting: bool | str, device: str) -> bool:
    """`[trainer] compile`: auto compiles on CUDA (on an H100 1.3-1.6x the eager step, at less memory:
    shared/notes/one-gpu.md), not on the CPU (inductor's CPU kernels gain little there and compiling takes
    minutes)."""
    return device.startswith("cuda") if setting == "auto" else bool(setting)


RECOMPILE_LIMIT = 64  # graphs per code object: the layers' variants (the first layer's input needs no gradient
# under LoRA; SDPA and FlexAttention rows; static then dynamic lengths; with and without gradients for the KL
# reference and validation), and transformers' FlexAttention kernel compiled per row length when layers are not
# compiled, pass torch's default of 8, past which dynamo runs the code eagerly (prime-rl sets 16 and 64)


def allow_recompiles() -> None:
    """Raise torch's limit of graphs per compiled function to RECOMPILE_LIMIT (never lower it)."""
    import torch

    if getattr(torch._dynamo.config, "recompile_limit", RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT


def compile_layers(model: Any) -> None:
    """torch.compile each decoder layer in place (its forward and backward; the layers share one compiled graph
    where their shapes agree), as prime-rl compiles per block. The first steps take longer while it compiles;
    a row length seen a second time is compiled as a dynamic dimension (torch's automatic dynamic shapes), so later
    lengths reuse it."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"[trainer].compile: no decoder layers found in {type(model).__name__}; set it to false")
    allow_recompiles()
    for layer in layers:
        layer.compile()


class CompileClock:
    """Seconds spent compiling and graphs compiled (torch.compile's own forward traces; a backward compiled when
    first run adds seconds, not graphs), from dynamo's compile callbacks (`torch._dynamo.callback`, torch 2.5+),
    which run once for the outermost compile. One per process (`compile_clock`); the trainer reads it between
    steps (`read`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.graphs = 0
        self._since: float | None = None

    def started(self, *args: Any) -> None:
        self._since = time.perf_counter()
        trigger = getattr(args[0], "callback_trigger", None) if args else None
        if trigger is None or getattr(trigger, "name", "") == "DYNAMO":
            self.graphs += 1

    def ended(self, *_args: Any) -> None:
        if self._since is not None:
            self.seconds += time.perf_counter() - self._since
            self._since = None

    def read(self) -> tuple[float, int]:
        return self.seconds, self.graphs


_CLOCK: CompileClock | None = None


def compile_clock() -> CompileClock | None:
    """The process's CompileClock, listening from the first call on; None where this torch has no compile
    callbacks."""
    global _CLOCK
    if _CLOCK is None:
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return None
        clock = CompileClock()
        callback_handler.register_start_callback(clock.started)
        callback_handler.register_end_callback(clock.ended)
        _CLOCK = clock
    return _CLOCK


def recompile_reasons(graphs: int) -> list[str]:
    """Why torch compiled its last `graphs` graphs (the guard that failed), as far as this torch records it."""
    try:
        from torch._dynamo.utils import get_compilation_metrics

        records = list(get_compilation_metrics())[-graphs:] if graphs > 0 else []
    except (ImportError, AttributeError):
        return []
    return [str(r.recompile_reason) for r in records if getattr(r, "recompile_reason", None)]


# Memory ------------------------------------------------------------------------------------------------------
# Activations a token of a row keeps for the backward pass, per decoder layer, in values of the model's dtype:
# ACTIVATION_HIDDEN x the hidden size + ACTIVATION_INTERMEDIATE x the MLP width a token passes through. The 4 is the
# SwiGLU MLP's (gate and up outputs, the activation, their product); the 34 is fitted to the rest (attention,
# float32 norms, rotary, residuals) as measured on an H100 (shared/notes/one-gpu.md): a Qwen3-0.6B shape (hidden
# 1024, intermediate 3072, 28 layers, bfloat16, LoRA r16 on every linear layer), one 16k row, peaked at 43.5 GiB
# eager and 31.3 GiB compiled, i.e. less the weights and the LM head, ~92 KB and ~64 KB a token per layer.
ACTIVATION_HIDDEN = 34
ACTIVATION_INTERMEDIATE = 4
COMPILED_ACTIVATIONS = 0.7  # what compiled layers keep of eager's (64 / 92 KB above: fused norms and rotary)
HEAD_COPIES = 5  # float32 [chunk, vocabulary] tensors the LM head holds at its peak (shared/notes/gpu-trainer.md:
# 2.76 GiB at 1,024 tokens a chunk and 46.8 GiB whole at 16,384 tokens, vocabulary 151,936: 4.8 and 5.0 copies)
OPTIMIZER_COPIES = 3  # per trainable parameter, in its dtype: its gradient and AdamW's two moments
MEMORY_MARGIN = 0.1  # of the estimate, and MEMORY_SLACK bytes, for the allocator's fragmentation, cuBLAS workspaces
MEMORY_SLACK = 2**30  # and what compiling takes


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a training step depends on."""

    hidden: int
    intermediate: int  # the MLP width a token passes through (a MoE's active experts together)
    layers: int
    vocab: int
    dtype_bytes: int
    trainable_bytes: int = 0  # the trainable parameters (this rank's share under FSDP)

    def layer_bytes(self, tokens: int, *, compiled: bool) -> float:
        """The activations one decoder layer keeps for a row of `tokens`."""
        per_token = (ACTIVATION_HIDDEN * self.hidden + ACTIVATION_INTERMEDIATE * self.intermediate) * \
            (COMPILED_ACTIVATIONS if compiled else 1.0)
        return tokens * per_token * self.dtype_bytes

    def step_bytes(self, tokens: int, *, checkpointed: bool, compiled: bool, head_chunk: int) -> int:
        """The estimated peak a training step adds to the loaded model for a row of `tokens`, with a margin: the
        gradients and optimizer state, and the LM head (`head_chunk` tokens at a time, 0: all) while every layer's
        activations are kept; with checkpointing, each layer's input kept, and then the larger of the LM head and one
        layer's activations recomputed in the backward pass (they are not held at once)."""
        chunk = min(tokens, head_chunk) if head_chunk > 0 else tokens
        head = chunk * self.vocab * 4 * HEAD_COPIES
        layer = self.layer_bytes(tokens, compiled=compiled)
        if checkpointed:
            activations = tokens * self.layers * self.hidden * self.dtype_bytes + max(head, layer)
        else:
            activations = self.layers * layer + head
        raw = activations + OPTIMIZER_COPIES * self.trainable_bytes
        return int(raw * (1 + MEMORY_MARGIN) + MEMORY_SLACK)


def model_shape(model: Any, trainable_bytes: int = 0) -> ModelShape:
    """The ModelShape of a transformers causal LM (its text config)."""
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(config.hidden_size)
    width = getattr(config, "moe_intermediate_size", None) or getattr(config, "intermediate_size", None) \
        or 4 * hidden
    experts = getattr(config, "num_experts_per_tok", None) or 1
    precision = precision_of(model)  # activations are in the compute dtype, not the master weights'
    dtype_bytes = precision.compute.itemsize if precision is not None else next(model.parameters()).element_size()
    return ModelShape(hidden=hidden, intermediate=int(width) * int(experts), layers=int(config.num_hidden_layers),
                      vocab=int(config.vocab_size), dtype_bytes=int(dtype_bytes), trainable_bytes=trainable_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    """The row budget and activation checkpointing a GPU trainer settles on at its first batch."""

    row_tokens: int
    checkpointing: bool
    available: int  # bytes the trainer could still allocate when the first batch came
    total: int  # the card's memory
    others: int  # bytes other processes (a sampler sharing the card) held then
    planned: int  # tokens of the largest row planned for: the budget, or a longer sample alone
    need: int  # the estimated peak a step adds for that row, under this plan
    need_plain: int  # the same without activation checkpointing
    auto_checkpointing: bool  # `[trainer] activation_checkpointing = "auto"` decided it
    shrunk_from: int | None = None  # the budget `row_budget` gave, when it was halved to fit

    def describe(self) -> str:
        """The trainer's log line."""
        gib = 2**30
        others = f"; other processes hold {self.others / gib:.1f} GiB" if self.others >= gib else ""
        line = (f"memory at the first batch: {self.available / gib:.1f} GiB of {self.total / gib:.1f} GiB free for "
                f"the trainer{others}; rows of up to {self.row_tokens} tokens")
        if self.shrunk_from:
            line += f" (not {self.shrunk_from}: too little memory)"
        if self.planned > self.row_tokens:
            line += f" (the longest sample, {self.planned}, alone)"
        plain = f"~{self.need_plain / gib:.1f} GiB a step"
        if self.checkpointing:
            line += (f" would need {plain} without activation checkpointing, more than is free; "
                     if self.need_plain > self.available else f" need {plain} without activation checkpointing; ")
            line += f"with it ~{self.need / gib:.1f} GiB: activation checkpointing on"
        else:
            line += f" need {plain}: activation checkpointing off"
        if self.auto_checkpointing:
            line += " (auto)"
        if self.need > self.available:
            line += ("; that is more than is free: a step may run out of memory (lower [trainer] micro_batch_tokens"
                     + ("" if self.checkpointing else ", set [trainer] activation_checkpointing = true")
                     + (", or lower [inference] gpu_memory_utilization" if self.others >= gib else "") + ")")
        return line


def plan_memory(shape: ModelShape, *, available: int, total: int, others: int = 0, row_tokens: int | None = None,
                longest: int = 0, checkpointing: bool | str = "auto", compiled: bool = False,
                head_chunk: int = DEFAULT_CHUNK_SIZE) -> MemoryPlan:
    """Rows and activation checkpointing for a GPU with `available` bytes free for the trainer's steps (the model
    loaded). The row budget is `row_tokens` (`[trainer] micro_batch_tokens`) or `row_budget(available)`; the
    largest row planned for is that budget, or the `longest` sample, which takes a row of its own. Checkpointing
    "auto" is on when that row's step would not fit without it. A budget of our own choosing halves (down to
    1,024 tokens) while the row does not fit even so."""
    budget = row_tokens or row_budget(available)

    def need(tokens: int, checkpointed: bool) -> int:
        return shape.step_bytes(max(tokens, longest), checkpointed=checkpointed, compiled=compiled,
                                head_chunk=head_chunk)

    auto = checkpointing == "auto"
    on = need(budget, False) > available if auto else bool(checkpointing)
    first = budget
    while row_tokens is None and budget > CPU_ROW_TOKENS and need(budget, on) > available:
        budget //= 2
    return MemoryPlan(row_tokens=budget, checkpointing=on, available=available, total=total, others=others,
                      planned=max(budget, longest), need=need(budget, on), need_plain=need(budget, False),
                      auto_checkpointing=auto, shrunk_from=first if budget < first else None)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                   top_p: float = 1.0, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token given the ones before it, under the distribution the sampler drew it from
    (`sampling_logits`): [batch, seq] aligned with `input_ids` (position 0, which nothing predicts, is 0), and the
    entropy of that distribution at each token (same alignment) when asked."""
    import torch

    with compute_context(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    chosen, entropy = chosen_logprobs(logits, input_ids[:, 1:], temperature, top_p, with_entropy=with_entropy)
    zero = torch.zeros_like(chosen[:, :1])
    return torch.cat([zero, chosen], dim=1), (torch.cat([zero, entropy], dim=1) if entropy is not None else None)


def score_row(forward: Any, owner: Any, inputs: dict[str, Any], targets: torch.Tensor, temperature: float = 1.0,
              top_p: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprob of each of a row's trained tokens `targets` [n] under the sampling distribution (with
    gradient; -inf for a token outside the top-p nucleus, which the loss leaves out) and its entropy (without):
    [1, n] each. `forward` runs the model (`owner` itself, or its DDP wrapper); the LM head is trainer/lm_head.py's
    chunked one (`chunk_size` tokens at a time) where the model's output layer allows it (`chunkable_head`), else
    the dense one. The forward runs in `owner`'s compute dtype (`compute_context`)."""
    head = chunkable_head(owner)[0] if chunk_size > 0 else None
    if head is None:
        with compute_context(owner):
            logits = forward(**inputs).logits
        logprobs, entropy = chosen_logprobs(logits, targets[None], temperature, top_p, with_entropy=True)
        assert entropy is not None
        return logprobs, entropy
    with sampled_head(head, targets, temperature, top_p, chunk_size), compute_context(owner):
        scored = forward(**inputs).logits  # [1, n, 2]: logprob, entropy
    return scored[..., 0], scored[..., 1].detach()


def reference_logprobs(model: Any, reference: Any | None, inputs: dict[str, Any], targets: torch.Tensor,
                       temperature: float, top_p: float, chunk_size: int) -> torch.Tensor:
    """The logprobs of the KL penalty's reference policy: `reference` (full fine-tuning keeps a frozen copy of the
    base model), or the LoRA policy with its adapter disabled (the base model, at no extra memory). -inf for a token
    outside the reference's nucleus: the penalty leaves it out (trainer/loss.py)."""
    if reference is not None:
        return score_row(reference, reference, inputs, targets, temperature, top_p, chunk_size)[0]
    with model.disable_adapter():
        return score_row(model, model, inputs, targets, temperature, top_p, chunk_size)[0]


@dataclass
class BatchResult:
    """A batch's loss and metrics. The means (entropy, KLs) are over the loss tokens inside the trainer's nucleus
    (`ref_kl`: inside the reference's too; `teacher_kl`, of the sampler's tokens, over every loss token); the
    fractions are shares of every loss token."""

    loss: float
    entropy: float
    mismatch_kl: float
    masked_fraction: float
    ref_kl: float | None
    loss_tokens: int
    tokens: int
    teacher_kl: float | None = None  # loss = "opd": mean (sampler - teacher) logprob of the trained tokens
    outside_nucleus: float = 0.0  # share of loss tokens outside the trainer's nucleus, left out of the loss


def accumulate_batch_gradients(model: Any, samples: list[Sample], *, device: str,
                               temperature: float = 1.0, top_p: float = 1.0, micro_batch_size: int | None = 8,
                               micro_batch_tokens: int | None = None, accumulation_steps: int = 1,
                               attention: str = "sdpa", lm_head_chunk_size: int = DEFAULT_CHUNK_SIZE,
                               ratio_low: float = 0.125, ratio_high: float = 8.0, kl_beta: float = 0.0,
                               reference: Any | None = None, dist: Dist | None = None, forward: Any | None = None,
                               grad_sync: Callable[[bool], AbstractContextManager[Any]] | None = None,
                               loss: str = "rl") -> BatchResult:
    """Forward and backward every micro-batch, each packed into one sequence (trainer/packing.py: a group's prompt
    once, no padding; at most `micro_batch_size` samples and `micro_batch_tokens` tokens a row); gradients add up
    to those of the loss over the whole batch (normalised by the batch's completion tokens). The caller clips and
    steps the optimizer. `attention` is how rows attend (trainer/attention.py: "mixed", "flex" or "sdpa", as
    `choose_attention` set the model up); the LM head takes `lm_head_chunk_size` tokens at a time (0: all).

    The KL penalty (`kl_beta` > 0) is to `reference_logprobs`. `loss` picks the objective (trainer/loss.py):
    "rl" (the policy gradient), "sft" (cross-entropy on the trained tokens; the caller passes temperature 1 and
    top_p 1) or "opd" (the policy gradient with the teacher's per-token advantage: every sample carries
    `teacher_logprobs`).

    Past one process (`dist`): each rank packs the whole batch the same way and trains on its share of the rows
    (`shard_rows`), through `forward` (the DDP or FSDP module); `grad_sync(last)` is the context of a backward
    (DDP reduces gradients only on each rank's last one). DDP and FSDP average gradients over the ranks, so each
    rank's loss is scaled by the world size: the result is the gradient of the whole batch's loss, as one process
    computes it. The returned metrics are summed over the ranks.

    A token outside the trainer's nucleus (logprob -inf: the sampler's policy is older) is left out of the loss and
    of every metric, and counted (`outside_nucleus`; trainer/loss.py)."""
    import contextlib

    import torch

    from prime_lab.trainer.distributed import shard_rows

    world = dist.world_size if dist is not None else 1
    forward = forward if forward is not None else model
    models = (model,) if reference is None else (model, reference)
    rows = pack(samples, micro_batch_size, max(accumulation_steps, world),
                share_prefixes=packs_prefixes(model, attention),
                max_tokens=micro_batch_tokens or default_row_tokens(device))
    total_loss_tokens = sum(len(row.targets) for row in rows)
    mine = shard_rows(rows, dist.rank if dist is not None else 0, world)
    # token-weighted sums: loss, entropy, mismatch KL, masked, reference KL, teacher KL, outside the nucleus; and
    # the tokens the means are over: inside the nucleus, inside the reference's too
    sums = [0.0] * 9
    for i, (row, weight) in enumerate(mine):
        use_row_attention(row, attention, *models)
        inputs = row_inputs(model, row, device, attention)
        targets = torch.tensor(row.targets, dtype=torch.long, device=device)
        sampler_logprobs = torch.tensor([row.sampler_logprobs], dtype=torch.float32, device=device)
        advantages = torch.tensor([row.advantages], dtype=torch.float32, device=device)
        loss_mask = torch.ones_like(sampler_logprobs)
        ref = None
        if kl_beta > 0:
            with torch.no_grad():
                ref = reference_logprobs(model, reference, inputs, targets, temperature, top_p, lm_head_chunk_size)
        sync = grad_sync(i == len(mine) - 1) if grad_sync is not None else contextlib.nullcontext()
        with sync:
            logprobs, entropy = score_row(forward, model, inputs, targets, temperature, top_p, lm_head_chunk_size)
            teacher_kl = 0.0
            inside = inside_nucleus(logprobs)
            if loss == "sft":
                out = LossOutput(cross_entropy_loss(logprobs, loss_mask, max(1, total_loss_tokens)), 0.0, 0.0)
            else:
                if loss == "opd":
                    if len(row.teacher_logprobs) != len(row.targets):
                        raise ValueError("loss = \"opd\": a sample of the batch has no teacher logprobs")
                    teacher = torch.tensor([row.teacher_logprobs], dtype=torch.float32, device=device)
                    advantages = distillation_advantages(advantages, teacher, logprobs)
                    teacher_kl = teacher_kl_sum(sampler_logprobs, teacher, loss_mask)
                out = policy_loss(logprobs, sampler_logprobs, advantages, loss_mask, ratio_low=ratio_low,
                                  ratio_high=ratio_high, ref_logprobs=ref, kl_beta=kl_beta,
                                  num_loss_tokens=max(1, total_loss_tokens))
            (out.loss * (weight * world)).backward()
        if not weight:
            continue
        row_tokens = float(len(row.targets))
        inside_tokens = float(inside.sum())
        sums[0] += float(out.loss.detach())
        sums[1] += float(torch.where(inside, entropy, 0.0).sum())
        sums[2] += out.mismatch_kl * inside_tokens
        sums[3] += out.masked_fraction * row_tokens
        if out.ref_kl is not None:
            sums[4] += out.ref_kl * out.ref_tokens
        sums[5] += teacher_kl
        sums[6] += row_tokens - inside_tokens
        sums[7] += inside_tokens
        sums[8] += out.ref_tokens
    if dist is not None:
        sums = dist.sum(sums)
    loss_sum, entropy_sum, kl_sum, masked_sum, ref_kl_sum, teacher_sum, outside_sum, inside_sum, ref_sum = sums
    tokens = sum(len(s.input_ids) for s in samples)
    n, inside_n = max(1, total_loss_tokens), max(1.0, inside_sum)
    return BatchResult(loss=loss_sum, entropy=entropy_sum / inside_n, mismatch_kl=kl_sum / inside_n,
                       masked_fraction=masked_sum / n, ref_kl=ref_kl_sum / max(1.0, ref_sum) if kl_beta > 0 else None,
                       loss_tokens=total_loss_tokens, tokens=tokens,
                       teacher_kl=teacher_sum / n if loss == "opd" else None,
                       outside_nucleus=outside_sum / n)


def mixed_precision(precision: Precision | None) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for a model kept in wider weights than it computes in (full fine-tuning's float32 master
    weights: trainer/model.py `Precision`): the weights gathered for the forward and backward in the compute dtype,
    gradients reduced and kept in float32 (prime-rl's policy). None: the weights as they are."""
    if precision is None or precision.params == precision.compute:
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)


def shard_model(model: Any) -> None:
    """FSDP2 in place: `fully_shard` on each decoder layer, then the root, under `mixed_precision`. The gathered
    weights are then in the compute dtype, so the forward needs no autocast (turned off in the model's Precision)."""
    import dataclasses

    from torch.distributed.fsdp import fully_shard

    precision = precision_of(model)
    policy = mixed_precision(precision)
    options: dict[str, Any] = {"mp_policy": policy} if policy is not None else {}
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    if precision is not None and precision.autocast:
        setattr(model, PRECISION_ATTR, dataclasses.replace(precision, autocast=False))
