"""Attention for batched decoding with grouped-query heads and a padding mask, without copying the KV cache.

transformers' SDPA path repeats every layer's cached keys and values across the query heads of their group
(`repeat_kv`, a full copy of the cache per layer per step) whenever an attention mask is passed, which a batch of
left-padded rows always needs. For a decode step (one query token per row) the query heads of a group can instead
be laid out as that group's query rows: `[B, kv_heads, group, D]` against keys `[B, kv_heads, L, D]`, one SDPA call
and no copy. Prefill (many query tokens) keeps transformers' own path.

Importing this module imports torch and transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_DECODE_SDPA = "prime_grouped_decode_sdpa"


def grouped_decode_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, query_length, head_dim = query.shape
    if groups == 1 or query_length != 1 or kwargs.get("position_bias") is not None or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    grouped = query.reshape(batch, heads // groups, groups, head_dim)
    output = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )  # the mask [B, 1, 1, L] broadcasts over the kv heads and the group's query rows
    return output.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_DECODE_SDPA, grouped_decode_sdpa)
AttentionMaskInterface.register(GROUPED_DECODE_SDPA, sdpa_mask)
