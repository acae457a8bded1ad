"""Batched sampling in torch: one call per decode step for the whole batch.

Reported logprobs are those of the distribution each token was drawn from, as vLLM's
`--logprobs-mode processed_logprobs` returns them (and as the trainer recomputes them, trainer/lm_head.py): the
log-softmax of the logits after banned tokens, temperature, then the top-k and top-p masks (the top-p rule is the
one the trainer shares, inference/nucleus.py), renormalised. A greedy row reports the log-softmax of its logits
(banned tokens excluded), with no temperature, top-k or top-p, as vLLM does. Tokens are drawn by inverting each
row's CDF at one uniform number: one random draw per row (not per vocabulary entry), so rows with a request seed
draw theirs from that request's own generator at no cost to the rest.

Prompt logprobs (`position_logprobs`) are those of the model's raw distribution, as vLLM reports them in either
logprobs mode: prompt tokens are not sampled, so no temperature, top-k or top-p applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prime_lab.inference.nucleus import keep_top_p

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; all choices (`n`) of a request share it."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    eos_token_ids: frozenset[int] = frozenset()  # empty with ignore_eos
    min_tokens: int = 0
    logprobs: bool = False
    top_logprobs: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class RowSampling:
    """Per-row sampling settings of a batch as tensors; rebuilt only when the batch's rows change."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    greedy: torch.Tensor
    generators: list[torch.Generator | None]
    all_greedy: bool
    any_greedy: bool
    all_unit_temperature: bool
    any_top_p: bool
    any_top_k: bool
    max_top_logprobs: int
    seeded_rows: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls, params: list[SamplingParams], generators: list[torch.Generator | None], device: torch.device
    ) -> RowSampling:
        import torch

        return cls(
            temperature=torch.tensor([p.temperature or 1.0 for p in params], device=device).unsqueeze(1),
            top_p=torch.tensor([p.top_p for p in params], device=device).unsqueeze(1),
            top_k=torch.tensor([max(p.top_k, 0) for p in params], device=device),
            greedy=torch.tensor([p.greedy for p in params], device=device),
            generators=generators,
            all_greedy=all(p.greedy for p in params),
            any_greedy=any(p.greedy for p in params),
            all_unit_temperature=all(p.temperature == 1.0 for p in params),
            any_top_p=any(p.top_p < 1.0 and not p.greedy for p in params),
            any_top_k=any(p.top_k > 0 and not p.greedy for p in params),
            max_top_logprobs=max((p.top_logprobs for p in params if p.logprobs), default=0),
            seeded_rows=[i for i, g in enumerate(generators) if g is not None],
        )


@dataclass
class SampledTokens:
    tokens: torch.Tensor  # [B] token ids
    logprobs: torch.Tensor  # [B] logprob of each sampled token under the distribution it was drawn from
    top_ids: torch.Tensor | None  # [B, k]
    top_logprobs: torch.Tensor | None  # [B, k]


def sample(logits: torch.Tensor, rows: RowSampling, banned: torch.Tensor | None = None) -> SampledTokens:
    """Sample one token per row from `logits` [B, V] (float32). `banned` [B, V] marks tokens not to sample."""
    import torch

    if banned is not None:
        logits = logits.masked_fill(banned, float("-inf"))
    if rows.all_greedy:
        processed = logits
        tokens = logits.argmax(dim=-1)
    else:
        processed = logits if rows.all_unit_temperature else logits / rows.temperature
        if rows.any_top_k:
            processed = keep_top_k(processed, rows.top_k)
        if rows.any_top_p:
            processed = keep_top_p(processed, rows.top_p)
        tokens = _inverse_cdf_draw(torch.softmax(processed, dim=-1), rows)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, logits.argmax(dim=-1), tokens)
            processed = torch.where(rows.greedy.unsqueeze(1), logits, processed)
    logprobs = torch.log_softmax(processed, dim=-1)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    top_ids = top_values = None
    if rows.max_top_logprobs > 0:
        top_values, top_ids = logprobs.topk(rows.max_top_logprobs, dim=-1)
    return SampledTokens(tokens, chosen, top_ids, top_values)


_DRAW_GENERATORS: dict[tuple[str, int], torch.Generator] = {}


def draw_generator(device: torch.device) -> torch.Generator:
    """The generator of unseeded draws on `device`: the server's own, not torch's default one. A CUDA graph
    capture registers the default CUDA generator and holds it in capture mode until the capture ends; a draw from
    it meanwhile (or after a capture that failed half-way) raises "Offset increment outside graph capture". Seeded
    with torch's initial seed (random per process unless `torch.manual_seed` set it: then reproducible)."""
    import torch

    key = (str(device), torch.initial_seed())
    if key not in _DRAW_GENERATORS:
        _DRAW_GENERATORS[key] = torch.Generator(device=device).manual_seed(key[1])
    return _DRAW_GENERATORS[key]


def _inverse_cdf_draw(probs: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """One token per row: the first whose cumulative probability exceeds u * total, u ~ U[0, 1)."""
    import torch

    uniform = torch.rand((probs.shape[0], 1), device=probs.device, generator=draw_generator(probs.device))
    for row in rows.seeded_rows:
        uniform[row] = torch.rand(1, generator=rows.generators[row], device=probs.device)
    cdf = probs.cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def keep_top_k(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """`scaled` [B, V] with all but each row's `top_k` [B] largest set to -inf (0 keeps the row whole)."""
    import torch

    k_max = int(top_k.max())
    kth = scaled.topk(min(k_max, scaled.shape[-1]), dim=-1).values
    index = (top_k.clamp(min=1, max=kth.shape[-1]) - 1).unsqueeze(1)
    threshold = kth.gather(1, index)
    threshold = torch.where(top_k.unsqueeze(1) > 0, threshold, torch.full_like(threshold, float("-inf")))
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def position_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int
) -> tuple[list[float], list[int], list[list[tuple[int, float]]]]:
    """For each row of `logits` [n, V] (any dtype; computed in float32): the raw logprob of `targets` [n], its rank
    (1 + the number of tokens more likely; a tie counts against it, as vLLM counts) and the `top_k` most likely
    (token id, logprob), most likely first."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, targets.unsqueeze(1))
    ranks = (logprobs >= chosen).sum(dim=-1)
    if top_k > 0:
        values, ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        top = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        top = [[] for _ in range(len(targets))]
    return chosen.squeeze(1).tolist(), ranks.tolist(), top
