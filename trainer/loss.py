"""The policy-gradient loss, as one short function that reads like its equation.

For completion token t of sample i, with trainer logprob l_it, sampler logprob s_it and group advantage A_i:

    ratio_it   = exp(l_it - s_it)                                  (importance ratio, sampler -> trainer)
    token_mask = loss_mask_it and ratio_low <= ratio_it <= ratio_high   (extreme ratios are masked, not clipped)
    loss       = - sum_it token_mask_it * ratio_it * A_i  /  sum_it loss_mask_it

normalised by the number of completion tokens in the batch (token-level, as DAPO / prime-rl), so long and short
completions weigh the same per token. On-policy (ratio = 1) its gradient is the plain policy gradient
-A_i * grad l_it, the same as TRL's GRPO loss with loss_type="dapo" and no reward scaling.

Optional KL penalty to a reference model (k3 estimator, always >= 0): beta * mean_t(exp(r - l) - (r - l) - 1).

A token outside the trainer's nucleus. With top_p < 1 the trainer's logprob of a token its current policy puts
outside the nucleus is -inf (trainer/lm_head.py). That is normal, not a corner: the sampler runs up to
`max_async_level` versions behind, and the nucleus moves. Such a token has ratio 0 and no finite KL, so it is left
out: `nucleus_mask = loss_mask and l_it > -inf` takes the place of `loss_mask` in the token mask, the KL penalty
(which also leaves out the tokens outside the reference's nucleus, r = -inf) and every metric of the trainer's
logprobs (not `teacher/kl`, below: the sampler's), while the normaliser stays every loss token (as for a token masked
for its ratio: the count is the batch's, fixed before any forward).
`outside_fraction` (`policy/outside_nucleus`) is their share of the loss tokens. A left-out logprob is replaced by a
finite stand-in before any exp or product, so it adds exactly zero gradient and no nan (-inf * 0 is nan, and so is
the gradient of an unselected `where` branch that is inf).

Two more losses share the packing and LM head (`LOSSES`):

- `sft` (supervised fine-tuning, and hard distillation: `loss = "sft"` trains on a teacher's rollouts): cross-entropy
  over the trained tokens, divided by their count in the step, as prime-rl's SFT trainer:
  `loss = - sum_it loss_mask_it * l_it / sum_it loss_mask_it` (l at temperature 1).
- `opd` (on-policy distillation, prime-rl's `opd`): the student samples, a teacher scores the student's tokens
  (logprob t_it), and each token's advantage gains the teacher's opinion of it, `A_it = A_i + (t_it - l_it)` with
  l_it detached: the policy gradient of the reverse KL from student to teacher, beside the reward's advantage (0 when
  every rollout of a group scores alike). `teacher/kl` is the KL of the sampling policy to the teacher, estimated on
  the tokens the sampler drew: `sum mask * (s - t) / sum mask` over every loss token (`teacher_kl_sum`). With the
  sampler's logprob s, not the trainer's l: the batch is up to `max_async_level` versions old, and `mean(l - t)`
  would estimate KL(sampler || teacher) minus the mismatch KL (0.72 where it was 1.75, two versions stale). The
  loss itself takes l - t (its gradient is that of the current policy's reverse KL).

Which logprobs: l and s are both taken under the distribution the token was actually sampled from, the model's
logits divided by `[sampling].temperature` with the tokens outside the `top_p` nucleus removed and the rest
renormalised (trainer/lm_head.py `sampling_logits`; vLLM runs with `--logprobs-mode processed_logprobs`, the built-in
server reports the same). With raw logprobs on either side the ratio at step 1 would be far from 1 whenever the
temperature is not 1 (mismatch KL 0.18 at T=0.7 on SmolLM2), and the objective would be wrong. At step 1 the two
agree to float precision (tests/trainer/test_sampler_agreement.py: mismatch KL < 1e-3 at T = 0.7, 1.0, 1.3 and
top_p 0.9, both engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class LossOutput:
    loss: torch.Tensor  # differentiable scalar
    mismatch_kl: float  # k3 KL between sampler and trainer, mean over loss tokens inside the nucleus (policy/kl)
    masked_fraction: float  # share of loss tokens (inside the nucleus) masked for an extreme ratio
    ref_kl: float | None = None  # k3 KL to the reference model (policy/ref_kl), when a penalty is on: mean over the
    # loss tokens inside both nuclei
    outside_fraction: float = 0.0  # share of loss tokens outside the trainer's nucleus (policy/outside_nucleus)
    inside_tokens: int = 0  # loss tokens inside the trainer's nucleus: what mismatch_kl is a mean over
    ref_tokens: int = 0  # loss tokens inside both nuclei: what ref_kl is a mean over


LOSSES = ("rl", "sft", "opd")


def cross_entropy_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, num_loss_tokens: int | None = None
                       ) -> torch.Tensor:
    """Mean negative logprob of the trained tokens: the SFT loss. `num_loss_tokens` as in `policy_loss`."""
    loss_mask = loss_mask.to(logprobs.dtype)
    denominator = float(num_loss_tokens) if num_loss_tokens is not None else float(loss_mask.sum().clamp(min=1))
    return -(logprobs * loss_mask).sum() / denominator


def distillation_advantages(advantages: torch.Tensor, teacher_logprobs: torch.Tensor, logprobs: torch.Tensor
                            ) -> torch.Tensor:
    """On-policy distillation's per-token advantage: the reward's advantage plus the teacher's logprob minus the
    student's (detached), so a token the teacher finds likelier than the student does is pushed up. A token outside
    the student's nucleus (logprob -inf, left out of the loss) gets the reward's advantage alone, not an infinite
    one."""
    import torch

    student = logprobs.detach()
    return advantages + torch.where(inside_nucleus(student), teacher_logprobs - student, 0.0)


def teacher_kl_sum(sampler_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, loss_mask: torch.Tensor
                   ) -> float:
    """`teacher/kl`'s sum over the loss tokens: sampler minus teacher logprob of each token the sampler drew (the
    k1 estimate of KL(sampler || teacher)); the caller divides by the batch's loss tokens. Every loss token counts,
    those outside the trainer's nucleus too: the sampler drew them, whatever the trainer's policy is now."""
    import torch

    return float(torch.where(loss_mask > 0, sampler_logprobs - teacher_logprobs, 0.0).sum())


def inside_nucleus(logprobs: torch.Tensor) -> torch.Tensor:
    """[..] trainer logprobs -> [..] bool: the tokens inside the trainer's nucleus (a finite logprob); the others
    are left out of the loss and of every metric."""
    return logprobs.detach().isfinite()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 KL estimator per token: exp(x) - x - 1 with x = log(q/p); non-negative, unbiased. As
    expm1(x) - x, clamped at 0: written as exp(x) - x - 1 it rounded to -1.8e-10 at step 1 (a "negative KL")."""
    import torch

    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)


def policy_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ratio_low: float = 0.125,
    ratio_high: float = 8.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    num_loss_tokens: int | None = None,
) -> LossOutput:
    """Shapes: logprobs, sampler_logprobs, loss_mask, ref_logprobs [batch, seq]; advantages [batch] (one per
    sequence) or [batch, seq] (one per token, as a packed row carries them).

    `num_loss_tokens` is the normaliser when a batch is split into micro-batches (the whole batch's count, so the
    micro-batch losses add up to the batch loss); by default this batch's own count.
    """
    import torch

    loss_mask = loss_mask.to(logprobs.dtype)
    denominator = float(num_loss_tokens) if num_loss_tokens is not None else float(loss_mask.sum().clamp(min=1))
    nucleus_mask = loss_mask * inside_nucleus(logprobs)
    logprobs = torch.where(nucleus_mask > 0, logprobs, 0.0)  # finite stand-ins where left out (no -inf below)
    # elsewhere the sampler logprob may be a placeholder: a log ratio of 0 there, so no exp overflows to inf
    log_ratio = torch.where(nucleus_mask > 0, logprobs - sampler_logprobs, 0.0)
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        within = ((ratio >= ratio_low) & (ratio <= ratio_high)).to(logprobs.dtype)
    token_mask = nucleus_mask * within
    ratio = torch.exp(torch.where(token_mask > 0, log_ratio, 0.0))  # an extreme ratio masked: 1, not inf * 0
    per_token = advantages if advantages.dim() == logprobs.dim() else advantages[:, None]
    loss = -(token_mask * ratio * per_token).sum() / denominator
    ref_kl, ref_tokens = None, 0
    if ref_logprobs is not None and kl_beta > 0:
        ref_mask = nucleus_mask * inside_nucleus(ref_logprobs)  # inside both nuclei
        ref_k3 = k3(torch.where(ref_mask > 0, ref_logprobs - logprobs, 0.0))
        loss = loss + kl_beta * (ref_k3 * ref_mask).sum() / denominator
        ref_tokens = int(ref_mask.sum())
        ref_kl = float((ref_k3.detach() * ref_mask).sum() / max(1, ref_tokens))
    with torch.no_grad():
        tokens = loss_mask.sum().clamp(min=1)
        inside_tokens = int(nucleus_mask.sum())
        # KL(sampler || trainer) from the sampler's own tokens: k3 of log(p_trainer / p_sampler)
        mismatch = float((k3(log_ratio.detach()) * nucleus_mask).sum() / max(1, inside_tokens))
        masked = float((nucleus_mask * (1 - within)).sum() / tokens)
        outside = float((loss_mask - nucleus_mask).sum() / tokens)
    return LossOutput(loss=loss, mismatch_kl=mismatch, masked_fraction=masked, ref_kl=ref_kl,
                      outside_fraction=outside, inside_tokens=inside_tokens, ref_tokens=ref_tokens)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position: [batch, seq, vocab] -> [batch, seq]. Tokens at -inf
    (outside a top-p nucleus) have probability 0 and add 0 (xlogy), not nan."""
    import torch

    p = torch.softmax(logits.float(), dim=-1)
    return -torch.special.xlogy(p, p).sum(-1)


def group_advantages(rewards: list[float], group_size: int, std_normalize: bool = False) -> list[float]:
    """Reward minus its group's mean (optionally divided by the group's std), groups of `group_size` in order."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / len(group)) ** 0.5
        out += [(r - mean) / (std + 1e-6) if std_normalize else r - mean for r in group]
    return out
