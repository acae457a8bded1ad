"""The policy loss against a hand computation, and the advantage computation."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import group_advantages, policy_loss, token_entropy


def test_loss_matches_a_hand_computation_with_masking() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]], requires_grad=True)
    sampler = torch.tensor([[-1.0, -2.5, -0.5], [-0.3, -0.5, -9.0]])
    advantages = torch.tensor([0.5, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = policy_loss(logprobs, sampler, advantages, mask, ratio_low=0.125, ratio_high=8.0)
    # ratios: row 0: 1, e^0.5, (not a loss token); row 1: 1, e^-3.5 (< 0.125, masked), e^8 (> 8, masked)
    expected = -(1.0 * 0.5 + math.exp(0.5) * 0.5 + 1.0 * -1.0) / 5
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.masked_fraction == pytest.approx(2 / 5)
    out.loss.backward()
    assert logprobs.grad is not None
    # d loss / d l = -mask * ratio * A / N ; masked tokens get no gradient
    grad = [[-0.5 / 5, -math.exp(0.5) * 0.5 / 5, 0.0], [1.0 / 5, 0.0, 0.0]]
    assert torch.allclose(logprobs.grad, torch.tensor(grad), atol=1e-6)


def test_on_policy_mismatch_kl_is_zero_and_micro_batches_add_up() -> None:
    torch.manual_seed(0)
    logprobs = -torch.rand(4, 6)
    mask = (torch.rand(4, 6) > 0.3).int()
    adv = torch.randn(4)
    whole = policy_loss(logprobs, logprobs, adv, mask)
    assert whole.mismatch_kl == pytest.approx(0.0, abs=1e-7)
    total = int(mask.sum())
    halves = sum(policy_loss(logprobs[i : i + 2], logprobs[i : i + 2], adv[i : i + 2], mask[i : i + 2],
                             num_loss_tokens=total).loss.item() for i in (0, 2))
    assert halves == pytest.approx(whole.loss.item(), rel=1e-6)


def test_kl_penalty_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]])
    base = dict(sampler_logprobs=logprobs, advantages=torch.tensor([0.0]), loss_mask=torch.ones(1, 2))
    at_ref = policy_loss(logprobs, ref_logprobs=logprobs, kl_beta=0.1, **base)
    away = policy_loss(logprobs, ref_logprobs=logprobs - 0.5, kl_beta=0.1, **base)
    assert at_ref.ref_kl == pytest.approx(0.0) and at_ref.loss.item() == pytest.approx(0.0)
    assert away.ref_kl is not None and away.ref_kl > 0 and away.loss.item() == pytest.approx(0.1 * away.ref_kl)


def test_entropy_of_uniform_and_peaked_distributions() -> None:
    logits = torch.stack([torch.zeros(8), torch.tensor([50.0] + [0.0] * 7)])[None]
    entropy = token_entropy(logits)[0]
    assert entropy[0].item() == pytest.approx(math.log(8), rel=1e-5)
    assert entropy[1].item() == pytest.approx(0.0, abs=1e-5)


def test_group_advantages() -> None:
    assert group_advantages([1, 0, 0.5, 0.5], 2) == [0.5, -0.5, 0.0, 0.0]
    normed = group_advantages([1.0, 0.0], 2, std_normalize=True)
    assert normed[0] == pytest.approx(1.0, rel=1e-4) and normed[1] == pytest.approx(-1.0, rel=1e-4)
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages([1.0, 0.0], 4)
