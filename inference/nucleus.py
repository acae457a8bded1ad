"""The top-p (nucleus) rule that the samplers and the trainer share: which tokens a top-p draw may pick.

A token stays while the probability of the tokens ranked above it is at most `top_p`, so the most likely token
always stays: vLLM's rule (`apply_top_k_top_p`), up to ties at the boundary. The built-in server masks its logits
with it before drawing (`inference/builtin/sampling.py`), and the trainer recomputes each sampled token's logprob
under the same distribution (`trainer/lm_head.py`), so that at step 1 the two agree.

torch is imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def outside_nucleus(sorted_probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """[..., V] probabilities sorted most likely first -> [..., V] bool: True for the tokens outside the nucleus
    (the probability of the tokens ranked above is more than `top_p`). The outside tokens are a suffix."""
    return (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p


def keep_top_p(scaled: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """`scaled` [..., V] with every token outside the nucleus set to -inf (`top_p` a float, or a tensor that
    broadcasts over [..., 1])."""
    import torch

    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    sorted_logits = sorted_logits.masked_fill(outside_nucleus(sorted_probs, top_p), float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
