"""A trained token outside the trainer's top-p nucleus (issue 35, item 1): the sampler runs up to `max_async_level`
versions behind, so a token it drew may lie outside the current policy's nucleus, where the trainer's logprob is
-inf. Such a token is masked out of the loss and of every metric and counted (`policy/outside_nucleus`); the KL
penalty, on-policy distillation and the reference KL stay finite, and the masked tokens add no gradient (no NaN)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.lm_head import chosen_logprobs, sampled_logprobs, sampling_logits
from prime_lab.trainer.loss import distillation_advantages, policy_loss
from prime_lab.trainer.model import accumulate_batch_gradients, load_policy, token_logprobs

# one position's distribution, most likely first: the tokens ranked above token 2 hold 0.7 of the probability, so
# token 2 is inside the nucleus at top_p 0.75 and just outside it at top_p 0.65; token 1 is inside at both
PROBS = [0.4, 0.3, 0.2, 0.1]


@pytest.mark.parametrize("head", ["chunked", "dense"])
def test_at_the_nucleus_edge_a_token_just_outside_is_masked_and_one_just_inside_is_trained(head: str) -> None:
    logits = torch.tensor([PROBS, PROBS]).log()
    targets = torch.tensor([1, 2])
    sampler = torch.tensor([[math.log(0.3), math.log(0.2)]])  # a sampler whose nucleus held both
    teacher = torch.tensor([[-1.0, -1.5]])
    advantages = torch.tensor([0.5])

    def run(top_p: float, loss_mask: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
        hidden = logits.clone().requires_grad_()
        if head == "chunked":
            logprob = sampled_logprobs(hidden, torch.eye(4), targets, 1.0, top_p, chunk_size=1)[0][None]
        else:
            logprob = chosen_logprobs(hidden[None], targets[None], 1.0, top_p)[0]
        ref = logprob.detach() - 0.3  # the reference policy: finite where the policy is
        out = policy_loss(logprob, sampler, distillation_advantages(advantages, teacher, logprob), loss_mask,
                          ref_logprobs=ref, kl_beta=0.1, num_loss_tokens=2)
        out.loss.backward()
        assert hidden.grad is not None
        return out, logprob.detach(), hidden.grad

    out, logprob, grad = run(0.65, torch.ones(1, 2))
    assert math.isfinite(out.mismatch_kl), f"policy/kl is {out.mismatch_kl}"
    assert out.ref_kl is not None and math.isfinite(out.ref_kl), f"policy/ref_kl is {out.ref_kl}"
    assert torch.isfinite(out.loss), f"loss is {out.loss}"
    assert torch.isfinite(grad).all(), f"gradient {grad}"
    assert logprob[0, 1].isneginf() and out.outside_fraction == pytest.approx(0.5)
    assert grad[1].abs().max() == 0  # token 2, just outside: no gradient at all
    # token 1 gets exactly what it gets when token 2 is not a loss token at all (same normaliser)
    alone, _, alone_grad = run(0.65, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(grad, alone_grad)
    assert out.loss.item() == pytest.approx(alone.loss.item())
    assert out.mismatch_kl == pytest.approx(alone.mismatch_kl) and out.ref_kl == pytest.approx(alone.ref_kl)
    assert out.masked_fraction == alone.masked_fraction == 0.0

    inside, inside_logprob, inside_grad = run(0.75, torch.ones(1, 2))
    assert torch.isfinite(inside_logprob).all() and inside.outside_fraction == 0.0
    assert bool(inside_grad[1].abs().max() > 0)  # token 2, just inside: trained


def test_a_token_outside_the_reference_nucleus_leaves_the_kl_penalty_finite() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.2, float("-inf"), -0.4]])  # token 2 is outside the reference's nucleus
    base = dict(sampler_logprobs=logprobs.detach(), advantages=torch.tensor([0.0]), loss_mask=torch.ones(1, 3))
    out = policy_loss(logprobs, ref_logprobs=ref, kl_beta=0.1, **base)  # type: ignore[arg-type]
    assert out.ref_kl is not None and math.isfinite(out.ref_kl), f"policy/ref_kl is {out.ref_kl}"
    out.loss.backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all(), logprobs.grad
    assert logprobs.grad[0, 1] == 0
    k3 = [math.exp(r - lp) - (r - lp) - 1 for r, lp in ((-1.2, -1.0), (-0.4, -0.5))]
    assert out.ref_kl == pytest.approx(sum(k3) / 2, rel=1e-5)  # the mean over the tokens both nuclei hold
    assert out.loss.item() == pytest.approx(0.1 * sum(k3) / 3, rel=1e-5)  # normalised by every loss token, as the rest


TEMPERATURE, TOP_P = 1.0, 0.5


def _set_adapter(model: torch.nn.Module, seed: int, std: float, *, add: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                step = torch.randn(param.shape, generator=gen) * std
                param.add_(step) if add else param.copy_(step)


@torch.no_grad()
def _stale_batch(model: Any) -> list[Sample]:
    """Two groups of three drawn by the policy as it was two versions ago, at top_p 0.5, with that version's
    logprobs as the sampler's, and the base model's raw logprobs as a teacher's."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    samples = []
    for group in range(2):
        prompt = [rng.randrange(vocab) for _ in range(6)]
        for i in range(3):
            ids, sampler = list(prompt), [0.0] * len(prompt)
            for _ in range(6):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                logprobs = torch.log_softmax(sampling_logits(logits, TEMPERATURE, TOP_P), dim=-1)
                ids.append(int(torch.multinomial(logprobs.exp(), 1, generator=gen)))
                sampler.append(float(logprobs[ids[-1]]))
            x = torch.tensor([ids])
            with model.disable_adapter():
                teacher = token_logprobs(model, x, torch.ones_like(x))[0][0].tolist()
            mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
            samples.append(Sample(ids, mask, sampler, (0.5, -0.7, 0.2)[i] * (1 if group else -1),
                                  teacher_logprobs=teacher))
    return samples


@pytest.mark.parametrize("loss", ["rl", "opd"])
def test_tokens_a_stale_policy_drew_outside_the_current_nucleus_are_masked(tiny_model_dir: Path,
                                                                          loss: str) -> None:
    """The trainer's batch path with the KL penalty on (and on-policy distillation): the batch, drawn two versions
    ago, holds tokens that the current policy and the reference put outside their nuclei. The loss, metrics and
    gradients are finite, and equal those of the same batch with the outside tokens left out of the loss (the loss
    and gradients scaled by the share of tokens inside, as the normaliser counts every loss token)."""
    torch.manual_seed(0)
    model = load_policy(tiny_model_dir)
    _set_adapter(model, 0, 0.05, add=False)
    samples = _stale_batch(model)
    _set_adapter(model, 1, 0.02, add=True)  # two updates later

    with torch.no_grad():  # which tokens the current policy puts outside its nucleus, and the reference
        outside, ref_outside = [], 0
        for s in samples:
            x = torch.tensor([s.input_ids])
            own = token_logprobs(model, x, torch.ones_like(x), TEMPERATURE, TOP_P)[0][0]
            outside.append([bool(m and own[t].isneginf()) for t, m in enumerate(s.loss_mask)])
            with model.disable_adapter():
                ref = token_logprobs(model, x, torch.ones_like(x), TEMPERATURE, TOP_P)[0][0]
            ref_outside += sum(bool(m and r.isneginf() and not own[t].isneginf())
                               for t, (m, r) in enumerate(zip(s.loss_mask, ref, strict=True)))
    n = sum(s.num_loss_tokens for s in samples)
    k = sum(map(sum, outside))
    assert 0 < k < n and ref_outside > 0  # the case under test: stale tokens, outside either nucleus

    def run(batch: list[Sample]) -> tuple[Any, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        result = accumulate_batch_gradients(model, batch, device="cpu", temperature=TEMPERATURE, top_p=TOP_P,
                                            micro_batch_size=4, lm_head_chunk_size=5, kl_beta=0.1, loss=loss)
        return result, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    result, grads = run(samples)
    assert math.isfinite(result.mismatch_kl), f"policy/kl is {result.mismatch_kl}"
    assert result.ref_kl is not None and math.isfinite(result.ref_kl), f"policy/ref_kl is {result.ref_kl}"
    assert math.isfinite(result.loss), f"loss is {result.loss}"
    assert grads and all(torch.isfinite(g).all() for g in grads.values()), "a gradient is not finite"
    assert result.outside_nucleus == pytest.approx(k / n)
    if loss == "opd":
        assert result.teacher_kl is not None and math.isfinite(result.teacher_kl)

    kept = [replace(s, loss_mask=[int(m and not o) for m, o in zip(s.loss_mask, out, strict=True)])
            for s, out in zip(samples, outside, strict=True)]
    alone, alone_grads = run(kept)
    assert alone.outside_nucleus == 0.0 and alone.loss_tokens == n - k
    share = (n - k) / n
    assert result.loss == pytest.approx(alone.loss * share, rel=1e-5)
    assert result.mismatch_kl == pytest.approx(alone.mismatch_kl, rel=1e-5)
    assert result.entropy == pytest.approx(alone.entropy, rel=1e-5)
    assert result.ref_kl == pytest.approx(alone.ref_kl, rel=1e-5)
    assert result.masked_fraction == pytest.approx(alone.masked_fraction * share, rel=1e-5)
    if loss == "opd":  # of the sampler's tokens: every loss token, those outside the trainer's nucleus too
        sampled = 0.0
        for s in samples:
            assert s.teacher_logprobs is not None
            sampled += sum(s.sampler_logprobs[t] - s.teacher_logprobs[t] for t, m in enumerate(s.loss_mask) if m)
        assert result.teacher_kl == pytest.approx(sampled / n, rel=1e-5)
    assert grads.keys() == alone_grads.keys()
    for name, want in alone_grads.items():
        torch.testing.assert_close(grads[name], want * share, rtol=1e-4, atol=1e-5 * float(want.abs().max()),
                                   msg=f"{name}: gradient differs")
