"""The top-p (nucleus) rule that the samplers and the trainer share: which tokens a top-p draw may pick.

A token stays while the probability of the tokens ranked above it is at most `top_p` (vLLM's rule,
`apply_top_k_top_p`), so the most likely token always stays; and every token whose logit equals the last one kept
stays too. That tie rule makes the nucleus a threshold on the logits (`top_p_threshold`: a token is inside iff its
logit >= the threshold), so which tokens are in depends on their values alone, not on how a sort orders equal ones.
Ties at the edge are rare in float32 and common in bfloat16 (a 50k vocabulary holds few distinct bf16 values near
the edge): a sorted prefix would keep some of a run of equal logits and drop the rest at random. The built-in server
masks its logits with it before drawing (`inference/builtin/sampling.py`), and the trainer recomputes each sampled
token's logprob under the same distribution (`trainer/lm_head.py`, from the same threshold), so that at step 1 the
two agree in any dtype. (vLLM keeps a sorted prefix: with bf16 ties at its edge the trainer, which keeps the whole
run, reports a slightly lower logprob than vLLM does.)

torch is imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def outside_nucleus(sorted_probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """[..., V] probabilities sorted most likely first -> [..., V] bool: True for the tokens ranked past the nucleus
    (the probability of the tokens ranked above is more than `top_p`), before the tie rule (`top_p_threshold`)."""
    return (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p


def top_p_threshold(sorted_logits: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """[..., V] logits sorted largest first -> [..., 1]: the smallest logit inside the nucleus. The nucleus is every
    token whose logit is >= it: the ranked prefix `outside_nucleus` leaves (at least the first token) and any token
    tied with its last one."""
    import torch

    probs = torch.softmax(sorted_logits, dim=-1)
    kept = outside_nucleus(probs, top_p).logical_not_().sum(dim=-1, keepdim=True).clamp_(min=1)
    return sorted_logits.gather(-1, kept - 1)


def keep_top_p(scaled: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """`scaled` [..., V] with every token outside the nucleus set to -inf (`top_p` a float, or a tensor that
    broadcasts over [..., 1])."""
    threshold = top_p_threshold(scaled.sort(dim=-1, descending=True).values, top_p)
    return scaled.masked_fill(scaled < threshold, float("-inf"))
