"""The policy the trainer updates: a transformers causal LM with a peft LoRA adapter, its token logprobs, and the
loss of one batch of samples computed in micro-batches (gradients accumulate; one optimizer step per batch).

torch, transformers and peft are imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.batch import Sample, micro_batches
from trainer.loss import policy_loss, token_entropy

if TYPE_CHECKING:
    import torch


def pick_device(requested: str = "auto") -> str:
    from lab.inference.vllm import cuda_available

    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    return requested


def pick_dtype(requested: str, device: str) -> torch.dtype:
    import torch

    if requested == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
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


def _linear_names(model: Any) -> list[str]:
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def pad(samples: list[Sample], pad_id: int, device: str) -> dict[str, torch.Tensor]:
    """Left-padded tensors for a micro-batch (input_ids, attention_mask, position_ids, loss_mask, sampler_logprobs,
    advantages). Left padding lines every completion up at the end, so logits are needed for the last
    `trained_tail(samples)` positions only."""
    import torch

    length = max(len(s.input_ids) for s in samples)

    def rows(attr: str, fill: float | int) -> list[list[Any]]:
        return [[fill] * (length - len(s.input_ids)) + list(getattr(s, attr)) for s in samples]

    attention = torch.tensor([[0] * (length - len(s.input_ids)) + [1] * len(s.input_ids) for s in samples],
                             dtype=torch.long, device=device)
    return {
        "input_ids": torch.tensor(rows("input_ids", pad_id), dtype=torch.long, device=device),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "loss_mask": torch.tensor(rows("loss_mask", 0), dtype=torch.float32, device=device),
        "sampler_logprobs": torch.tensor(rows("sampler_logprobs", 0.0), dtype=torch.float32, device=device),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
    }


def trained_tail(samples: list[Sample]) -> int:
    """How many positions at the end of a left-padded micro-batch hold every trained token (at least 1, and fewer
    than the padded length: position 0 has nothing before it to predict it)."""
    length = max(len(s.input_ids) for s in samples)
    keep = max((len(s.loss_mask) - s.loss_mask.index(1) for s in samples if 1 in s.loss_mask), default=1)
    return min(keep, length - 1)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
                   *, position_ids: torch.Tensor | None = None, keep: int | None = None,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token given the ones before it, from logits divided by the sampling temperature.

    Returns [batch, seq] aligned with `input_ids` (position 0, which nothing predicts, is 0) or, with `keep`, with
    the last `keep` positions only (the model then computes logits for those alone); and the entropy of the
    distribution each token was drawn from (same alignment) when asked.
    """
    import torch

    kwargs: dict[str, Any] = {"logits_to_keep": keep + 1} if keep is not None else {}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -logits.shape[1]:]
    chosen = logp.gather(-1, targets[:, :, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = token_entropy(logits)
    if keep is not None:
        return chosen, entropy
    zero = torch.zeros_like(chosen[:, :1])
    return torch.cat([zero, chosen], dim=1), (torch.cat([zero, entropy], dim=1) if entropy is not None else None)


@dataclass
class BatchResult:
    loss: float
    entropy: float
    mismatch_kl: float
    masked_fraction: float
    ref_kl: float | None
    loss_tokens: int
    tokens: int


def accumulate_batch_gradients(model: Any, samples: list[Sample], *, pad_id: int, device: str,
                               temperature: float = 1.0, micro_batch_size: int = 8, accumulation_steps: int = 1,
                               ratio_low: float = 0.125, ratio_high: float = 8.0, kl_beta: float = 0.0) -> BatchResult:
    """Forward and backward every micro-batch; gradients add up to those of the loss over the whole batch
    (normalised by the batch's completion tokens). The caller clips and steps the optimizer."""
    import torch

    total_loss_tokens = sum(s.num_loss_tokens for s in samples)
    loss_sum = entropy_sum = kl_sum = masked_sum = ref_kl_sum = 0.0
    tokens = 0
    for chunk in micro_batches(samples, micro_batch_size, accumulation_steps):
        t = pad(chunk, pad_id, device)
        keep = trained_tail(chunk)
        t["loss_mask"], t["sampler_logprobs"] = t["loss_mask"][:, -keep:], t["sampler_logprobs"][:, -keep:]
        ref = None
        if kl_beta > 0:
            with torch.no_grad(), model.disable_adapter():
                ref, _ = token_logprobs(model, t["input_ids"], t["attention_mask"], temperature,
                                        position_ids=t["position_ids"], keep=keep)
        logprobs, entropy = token_logprobs(model, t["input_ids"], t["attention_mask"], temperature,
                                           position_ids=t["position_ids"], keep=keep, with_entropy=True)
        out = policy_loss(logprobs, t["sampler_logprobs"], t["advantages"], t["loss_mask"], ratio_low=ratio_low,
                          ratio_high=ratio_high, ref_logprobs=ref, kl_beta=kl_beta,
                          num_loss_tokens=max(1, total_loss_tokens))
        out.loss.backward()
        chunk_tokens = float(t["loss_mask"].sum())
        loss_sum += float(out.loss.detach())
        assert entropy is not None
        entropy_sum += float((entropy * t["loss_mask"]).sum())
        kl_sum += out.mismatch_kl * chunk_tokens
        masked_sum += out.masked_fraction * chunk_tokens
        if out.ref_kl is not None:
            ref_kl_sum += out.ref_kl * chunk_tokens
        tokens += int(t["attention_mask"].sum())
    n = max(1, total_loss_tokens)
    return BatchResult(loss=loss_sum, entropy=entropy_sum / n, mismatch_kl=kl_sum / n, masked_fraction=masked_sum / n,
                       ref_kl=ref_kl_sum / n if kl_beta > 0 else None, loss_tokens=total_loss_tokens, tokens=tokens)
