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

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.loss import policy_loss, token_entropy
from prime_lab.trainer.packing import PackedRow, pack

if TYPE_CHECKING:
    import torch

    from prime_lab.trainer.distributed import Dist


def pick_device(requested: str = "auto") -> str:
    from prime_lab.lab.inference.vllm import cuda_available

    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    return requested


def pick_dtype(requested: str, device: str) -> torch.dtype:
    import torch

    if requested == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[requested]


def load_policy(model_path: Path, *, lora_r: int = 16, lora_alpha: float = 16, lora_dropout: float = 0.0,
                target_modules: list[str] | None = None, device: str = "cpu", dtype: str = "auto",
                adapter_path: Path | None = None) -> Any:
    """The base model at `model_path` with a trainable LoRA adapter (fresh, or the one saved at `adapter_path`)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch_dtype = pick_dtype(dtype, device)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
    base.to(device)  # type: ignore[arg-type]
    base.config.use_cache = False
    if adapter_path is not None:
        return PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
    missing = [m for m in (target_modules or []) if not any(n.endswith("." + m) for n, _ in base.named_modules())]
    if missing:
        raise ValueError(f"[lora].target_modules: {', '.join(missing)} not found in {model_path.name}; its linear "
                         f"layers include {', '.join(_linear_names(base)[:12])}")
    config = LoraConfig(r=lora_r, lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft accepts a float
                        lora_dropout=lora_dropout, target_modules=target_modules,
                        task_type="CAUSAL_LM", bias="none")
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


def _linear_names(model: Any) -> list[str]:
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


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


def sampling_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """The logits of the distribution a sampled token was drawn from: divided by the temperature, then the tokens
    outside the top-p nucleus at -inf. Both samplers report their logprobs under this distribution (vLLM with
    `--logprobs-mode processed_logprobs`, the built-in server always), so at step 1 the trainer's logprobs equal
    the sampler's and the importance ratio is 1 at any temperature and top_p. The nucleus is chosen without
    gradient (the sampled token is always inside it); the gradient flows through the kept logits.
    Temperature 0 (greedy) is left as 1, as the samplers report it."""
    from prime_lab.lab.inference.builtin.sampling import keep_top_p

    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0 and temperature > 0:
        outside = keep_top_p(logits.detach(), top_p).isneginf()
        logits = logits.masked_fill(outside, float("-inf"))
    return logits


def chosen_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, *,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `targets` [batch, n] under `logits` [batch, n, vocab] as sampled (`sampling_logits`), and
    (without gradient) the entropies of those distributions when asked."""
    import torch

    logits = sampling_logits(logits, temperature, top_p)
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = token_entropy(logits)
    return chosen, entropy


def attention_implementation(model: Any) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def row_inputs(model: Any, row: PackedRow, device: str) -> dict[str, torch.Tensor | None]:
    """The model's inputs for a packed row (built once, for the policy pass and the reference pass alike): its
    tokens, position ids, the positions whose logits are kept, and its attention mask in the form the model's
    attention takes: None (plain causal) for a single sample, booleans for SDPA, an additive float mask for eager."""
    import torch

    mask = None
    if row.needs_mask():
        mask = row.attention_mask(device)
        if attention_implementation(model) != "sdpa":
            dtype = next(model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    return {"input_ids": torch.tensor([row.input_ids], dtype=torch.long, device=device),
            "position_ids": torch.tensor([row.position_ids], dtype=torch.long, device=device),
            "logits_to_keep": torch.tensor(row.sources, dtype=torch.long, device=device),
            "attention_mask": mask}


def reference_logits(model: Any, reference: Any | None, inputs: dict[str, Any]) -> torch.Tensor:
    """The logits of the KL penalty's reference policy: `reference` (full fine-tuning keeps a frozen copy of the
    base model), or the LoRA policy with its adapter disabled (the base model, at no extra memory)."""
    if reference is not None:
        return reference(**inputs).logits
    with model.disable_adapter():
        return model(**inputs).logits


@dataclass
class BatchResult:
    loss: float
    entropy: float
    mismatch_kl: float
    masked_fraction: float
    ref_kl: float | None
    loss_tokens: int
    tokens: int


def accumulate_batch_gradients(model: Any, samples: list[Sample], *, device: str,
                               temperature: float = 1.0, top_p: float = 1.0, micro_batch_size: int = 8,
                               accumulation_steps: int = 1,
                               ratio_low: float = 0.125, ratio_high: float = 8.0, kl_beta: float = 0.0,
                               reference: Any | None = None, dist: Dist | None = None, forward: Any | None = None,
                               grad_sync: Callable[[bool], AbstractContextManager[Any]] | None = None) -> BatchResult:
    """Forward and backward every micro-batch, each packed into one sequence (trainer/packing.py: a group's prompt
    once, no padding); gradients add up to those of the loss over the whole batch (normalised by the batch's
    completion tokens). The caller clips and steps the optimizer.

    The KL penalty (`kl_beta` > 0) is to `reference_logits`.

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
                share_prefixes=attention_implementation(model) in ("sdpa", "eager"))
    total_loss_tokens = sum(len(row.targets) for row in rows)
    mine = shard_rows(rows, dist.rank if dist is not None else 0, world)
    sums = [0.0] * 5  # loss, entropy, mismatch KL, masked, reference KL: token-weighted sums
    for i, (row, weight) in enumerate(mine):
        inputs = row_inputs(model, row, device)
        targets = torch.tensor([row.targets], dtype=torch.long, device=device)
        sampler_logprobs = torch.tensor([row.sampler_logprobs], dtype=torch.float32, device=device)
        advantages = torch.tensor([row.advantages], dtype=torch.float32, device=device)
        loss_mask = torch.ones_like(sampler_logprobs)
        ref = None
        if kl_beta > 0:
            with torch.no_grad():
                ref, _ = chosen_logprobs(reference_logits(model, reference, inputs), targets, temperature, top_p)
        sync = grad_sync(i == len(mine) - 1) if grad_sync is not None else contextlib.nullcontext()
        with sync:
            logprobs, entropy = chosen_logprobs(forward(**inputs).logits, targets, temperature, top_p,
                                                 with_entropy=True)
            out = policy_loss(logprobs, sampler_logprobs, advantages, loss_mask, ratio_low=ratio_low,
                              ratio_high=ratio_high, ref_logprobs=ref, kl_beta=kl_beta,
                              num_loss_tokens=max(1, total_loss_tokens))
            (out.loss * (weight * world)).backward()
        if not weight:
            continue
        row_tokens = float(len(row.targets))
        assert entropy is not None
        sums[0] += float(out.loss.detach())
        sums[1] += float(entropy.sum())
        sums[2] += out.mismatch_kl * row_tokens
        sums[3] += out.masked_fraction * row_tokens
        if out.ref_kl is not None:
            sums[4] += out.ref_kl * row_tokens
    if dist is not None:
        sums = dist.sum(sums)
    loss, entropy_sum, kl_sum, masked_sum, ref_kl_sum = sums
    tokens = sum(len(s.input_ids) for s in samples)
    n = max(1, total_loss_tokens)
    return BatchResult(loss=loss, entropy=entropy_sum / n, mismatch_kl=kl_sum / n, masked_fraction=masked_sum / n,
                       ref_kl=ref_kl_sum / n if kl_beta > 0 else None, loss_tokens=total_loss_tokens, tokens=tokens)
