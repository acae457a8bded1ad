"""A property test of the LM head (trainer/lm_head.py): on random cases (shapes, temperatures, top_p, float32 and
bfloat16, chunk sizes, trained tokens inside and outside the nucleus) the chunked head and the dense one give the
logprobs, entropies and gradients of a dense reference written here from the rule itself (inference/nucleus.py's
docstring: the ranked prefix whose earlier tokens hold at most top_p, at least one token, and every token tied with
its last one), in float64 from the logits as the model's dtype computes them. A fixed seed loop, not hypothesis."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from prime_lab.trainer.lm_head import chosen_logprobs, sampled_logprobs

CASES = 160


def _kept(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, vocab] float32 -> bool: inside the nucleus, by the rule, one row at a time."""
    kept = torch.ones_like(scaled, dtype=torch.bool)
    if top_p >= 1.0:
        return kept
    for row in range(scaled.shape[0]):
        ordered = scaled[row].sort(descending=True).values
        probs = torch.softmax(ordered, dim=-1)
        earlier = probs.cumsum(-1) - probs
        count = max(1, int((earlier <= top_p).sum()))
        kept[row] = scaled[row] >= ordered[count - 1]
    return kept


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logprobs [n] (float64, -inf outside the nucleus), the entropies [n], and the logits as the head's matmul
    gives them in the model's dtype, made float32 [n, vocab]."""
    logits = torch.nn.functional.linear(hidden, weight).float()  # as nn.Linear computes it, then float32
    scaled = logits / temperature if temperature > 0 and temperature != 1.0 else logits
    kept = _kept(scaled, top_p if temperature > 0 else 1.0)
    logprobs = torch.log_softmax(scaled.double().masked_fill(~kept, float("-inf")), dim=-1)
    probs = logprobs.exp()
    entropy = -torch.where(kept, probs * logprobs, 0.0).sum(-1)
    return logprobs.gather(-1, targets[:, None]).squeeze(-1), entropy, kept


def _reference_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                     kept: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d sum(upstream * logprob over the tokens inside) / d (hidden, weight), in float64."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    logits = h @ w.T
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits.masked_fill(~kept, float("-inf")), dim=-1)
    chosen = logprobs.gather(-1, targets[:, None]).squeeze(-1)
    inside = chosen.detach().isfinite()
    (upstream * torch.where(inside, chosen, 0.0)).sum().backward()
    assert h.grad is not None and w.grad is not None
    return h.grad, w.grad


def _grads(logprob: torch.Tensor, upstream: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor
           ) -> tuple[torch.Tensor, ...]:
    """The loss's use: a token outside the nucleus is left out with a `where` (trainer/loss.py)."""
    loss = (upstream * torch.where(logprob.detach().isfinite(), logprob, 0.0)).sum()
    return torch.autograd.grad(loss, (hidden, weight))


def _prefixed(prefix: str) -> Callable[[str], str]:
    return lambda message: f"{prefix}: {message}"


def test_the_head_equals_a_dense_reference_on_random_cases() -> None:
    rng = random.Random(35)
    seen = {"outside": 0, "bf16 ties at the edge": 0, "greedy": 0}
    for case in range(CASES):
        gen = torch.Generator().manual_seed(case)
        n, d, vocab = rng.randint(1, 48), rng.choice([4, 8, 16, 32]), rng.randint(2, 900)
        dtype = rng.choice([torch.float32, torch.bfloat16])
        temperature = rng.choice([0.0, 0.5, 0.7, 1.0, 1.0, 1.3, 2.0])
        top_p = rng.choice([1.0, 0.99, 0.9, 0.7, 0.5, 0.2, 0.01])
        chunk = rng.choice([1, 3, rng.randint(1, n), n, n + 7])
        spread = rng.choice([0.3, 1.0, 3.0])
        hidden = torch.randn(n, d, generator=gen).mul(spread).to(dtype).requires_grad_()
        weight = (torch.randn(vocab, d, generator=gen) / d**0.5).to(dtype).requires_grad_()
        with torch.no_grad():  # half the targets drawn from the nucleus, half anywhere in the vocabulary
            _, _, kept = _reference(hidden, weight, torch.zeros(n, dtype=torch.long), temperature, top_p)
            drawn = torch.multinomial(kept.float(), 1, generator=gen).squeeze(-1)
            anywhere = torch.randint(vocab, (n,), generator=gen)
            targets = torch.where(torch.rand(n, generator=gen) < 0.5, drawn, anywhere)
        want, want_entropy, kept = _reference(hidden, weight, targets, temperature, top_p)
        upstream = torch.randn(n, generator=gen, dtype=torch.float64)
        want_grads = _reference_grads(hidden, weight, targets, temperature, kept, upstream)
        seen["outside"] += int(want.isneginf().sum())
        seen["greedy"] += temperature == 0.0
        if dtype == torch.bfloat16 and top_p < 1.0 and temperature > 0:
            scaled = torch.nn.functional.linear(hidden, weight).float()
            scaled = scaled / temperature if temperature != 1.0 else scaled
            edge = torch.where(kept, scaled, float("inf")).min(-1).values
            seen["bf16 ties at the edge"] += int(((scaled == edge[:, None]).sum(-1) > 1).sum())

        label = (f"case {case}: n={n} d={d} vocab={vocab} {dtype} T={temperature} top_p={top_p} chunk={chunk}")
        chunked, entropy = sampled_logprobs(hidden, weight, targets, temperature, top_p, chunk_size=chunk)
        dense = chosen_logprobs(torch.nn.functional.linear(hidden, weight)[None], targets[None], temperature, top_p,
                                with_entropy=True)
        assert dense[1] is not None
        for name, got, got_entropy in (("chunked", chunked, entropy), ("dense", dense[0][0], dense[1][0])):
            assert torch.equal(got.isneginf(), want.isneginf()), f"{label}, {name}: not the reference's nucleus"
            inside = want.isfinite()
            torch.testing.assert_close(got.double()[inside], want[inside], rtol=1e-5, atol=2e-5,
                                       msg=_prefixed(f"{label}, {name} logprobs"))
            torch.testing.assert_close(got_entropy.double(), want_entropy, rtol=1e-5, atol=2e-5,
                                       msg=_prefixed(f"{label}, {name} entropy"))
            grads = _grads(got, upstream.to(got.dtype), hidden, weight)
            tolerance = 1e-4 if dtype == torch.float32 else 3e-2
            for part, g, w in zip(("hidden", "weight"), grads, want_grads, strict=True):
                assert torch.isfinite(g).all(), f"{label}, {name}: {part} gradient not finite"
                torch.testing.assert_close(g.double(), w, rtol=tolerance, atol=tolerance * float(w.abs().max()),
                                           msg=_prefixed(f"{label}, {name} d/d{part}"))
    # the cases the test is for came up
    assert seen["outside"] > 100 and seen["bf16 ties at the edge"] > 20 and seen["greedy"] > 5, seen
