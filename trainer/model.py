"""The policy the trainer updates: a transformers causal LM with a peft LoRA adapter (or, for full fine-tuning, the
whole model), its token logprobs, and the loss of one batch of samples computed in micro-batches (gradients
accumulate; one optimizer step per batch).

torch, transformers and peft are imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prime_lab.trainer.attention import default_row_tokens, packs_prefixes, row_inputs
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.lm_head import DEFAULT_CHUNK_SIZE, chosen_logprobs, chunkable_head, sampled_head
from prime_lab.trainer.loss import LossOutput, cross_entropy_loss, distillation_advantages, policy_loss
from prime_lab.trainer.packing import pack

if TYPE_CHECKING:
    import torch

    from prime_lab.trainer.distributed import Dist


def pick_device(requested: str = "auto") -> str:
    from prime_lab.runs.hardware import cuda_available

    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    return requested


def pick_dtype(requested: str, device: str) -> torch.dtype:
    import torch

    if requested == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[requested]


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
    reference policy of the KL penalty). Tied weights (an LM head tied to the embeddings) stay one parameter."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=pick_dtype(dtype, device))
    model.to(device)  # type: ignore[arg-type]
    model.config.use_cache = False
    model.requires_grad_(trainable)
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


def compile_layers(model: Any) -> None:
    """torch.compile each decoder layer in place (its forward and backward; the layers share one compiled graph
    where their shapes agree), as prime-rl compiles per block. The first steps take longer while it compiles."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"[trainer].compile: no decoder layers found in {type(model).__name__}; set it to false")
    for layer in layers:
        layer.compile()


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                   top_p: float = 1.0, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token given the ones before it, under the distribution the sampler drew it from
    (`sampling_logits`): [batch, seq] aligned with `input_ids` (position 0, which nothing predicts, is 0), and the
    entropy of that distribution at each token (same alignment) when asked."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    chosen, entropy = chosen_logprobs(logits, input_ids[:, 1:], temperature, top_p, with_entropy=with_entropy)
    zero = torch.zeros_like(chosen[:, :1])
    return torch.cat([zero, chosen], dim=1), (torch.cat([zero, entropy], dim=1) if entropy is not None else None)


def score_row(forward: Any, owner: Any, inputs: dict[str, Any], targets: torch.Tensor, temperature: float = 1.0,
              top_p: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprob of each of a row's trained tokens `targets` [n] under the sampling distribution (with
    gradient) and its entropy (without): [1, n] each. `forward` runs the model (`owner` itself, or its DDP
    wrapper); the LM head is trainer/lm_head.py's chunked one (`chunk_size` tokens at a time) where the model's
    output layer allows it (`chunkable_head`), else the dense one."""
    head = chunkable_head(owner)[0] if chunk_size > 0 else None
    if head is None:
        logprobs, entropy = chosen_logprobs(forward(**inputs).logits, targets[None], temperature, top_p,
                                            with_entropy=True)
        assert entropy is not None
        return logprobs, entropy
    with sampled_head(head, targets, temperature, top_p, chunk_size):
        scored = forward(**inputs).logits  # [1, n, 2]: logprob, entropy
    return scored[..., 0], scored[..., 1].detach()


def reference_logprobs(model: Any, reference: Any | None, inputs: dict[str, Any], targets: torch.Tensor,
                       temperature: float, top_p: float, chunk_size: int) -> torch.Tensor:
    """The logprobs of the KL penalty's reference policy: `reference` (full fine-tuning keeps a frozen copy of the
    base model), or the LoRA policy with its adapter disabled (the base model, at no extra memory)."""
    if reference is not None:
        return score_row(reference, reference, inputs, targets, temperature, top_p, chunk_size)[0]
    with model.disable_adapter():
        return score_row(model, model, inputs, targets, temperature, top_p, chunk_size)[0]


@dataclass
class BatchResult:
    loss: float
    entropy: float
    mismatch_kl: float
    masked_fraction: float
    ref_kl: float | None
    loss_tokens: int
    tokens: int
    teacher_kl: float | None = None  # loss = "opd": mean (student - teacher) logprob of the trained tokens


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
    steps the optimizer. `attention` is how rows attend (trainer/attention.py: "flex" or "sdpa", as
    `choose_attention` set the model up); the LM head takes `lm_head_chunk_size` tokens at a time (0: all).

    The KL penalty (`kl_beta` > 0) is to `reference_logprobs`. `loss` picks the objective (trainer/loss.py):
    "rl" (the policy gradient), "sft" (cross-entropy on the trained tokens; the caller passes temperature 1 and
    top_p 1) or "opd" (the policy gradient with the teacher's per-token advantage: every sample carries
    `teacher_logprobs`).

    Past one process (`dist`): each rank packs the whole batch the same way and trains on its share of the rows
    (`shard_rows`), through `forward` (the DDP or FSDP module); `grad_sync(last)` is the context of a backward
    (DDP reduces gradients only on each rank's last one). DDP and FSDP average gradients over the ranks, so each
    rank's loss is scaled by the world size: the result is the gradient of the whole batch's loss, as one process
    computes it. The returned metrics are summed over the ranks."""
    import contextlib

    import torch

    from prime_lab.trainer.distributed import shard_rows

    world = dist.world_size if dist is not None else 1
    forward = forward if forward is not None else model
    rows = pack(samples, micro_batch_size, max(accumulation_steps, world),
                share_prefixes=packs_prefixes(model, attention),
                max_tokens=micro_batch_tokens or default_row_tokens(device))
    total_loss_tokens = sum(len(row.targets) for row in rows)
    mine = shard_rows(rows, dist.rank if dist is not None else 0, world)
    sums = [0.0] * 6  # loss, entropy, mismatch KL, masked, reference KL, teacher KL: token-weighted sums
    for i, (row, weight) in enumerate(mine):
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
            if loss == "sft":
                out = LossOutput(cross_entropy_loss(logprobs, loss_mask, max(1, total_loss_tokens)), 0.0, 0.0)
            else:
                if loss == "opd":
                    if len(row.teacher_logprobs) != len(row.targets):
                        raise ValueError("loss = \"opd\": a sample of the batch has no teacher logprobs")
                    teacher = torch.tensor([row.teacher_logprobs], dtype=torch.float32, device=device)
                    advantages = distillation_advantages(advantages, teacher, logprobs)
                    teacher_kl = float((logprobs.detach() - teacher).sum())
                out = policy_loss(logprobs, sampler_logprobs, advantages, loss_mask, ratio_low=ratio_low,
                                  ratio_high=ratio_high, ref_logprobs=ref, kl_beta=kl_beta,
                                  num_loss_tokens=max(1, total_loss_tokens))
            (out.loss * (weight * world)).backward()
        if not weight:
            continue
        row_tokens = float(len(row.targets))
        sums[0] += float(out.loss.detach())
        sums[1] += float(entropy.sum())
        sums[2] += out.mismatch_kl * row_tokens
        sums[3] += out.masked_fraction * row_tokens
        if out.ref_kl is not None:
            sums[4] += out.ref_kl * row_tokens
        sums[5] += teacher_kl
    if dist is not None:
        sums = dist.sum(sums)
    loss_sum, entropy_sum, kl_sum, masked_sum, ref_kl_sum, teacher_kl_sum = sums
    tokens = sum(len(s.input_ids) for s in samples)
    n = max(1, total_loss_tokens)
    return BatchResult(loss=loss_sum, entropy=entropy_sum / n, mismatch_kl=kl_sum / n,
                       masked_fraction=masked_sum / n, ref_kl=ref_kl_sum / n if kl_beta > 0 else None,
                       loss_tokens=total_loss_tokens, tokens=tokens,
                       teacher_kl=teacher_kl_sum / n if loss == "opd" else None)
