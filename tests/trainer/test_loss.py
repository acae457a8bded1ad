"""The policy loss against a hand computation (on tensors, and through the trainer's batch path on the tiny model),
and the advantage computation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.loss import group_advantages, policy_loss, token_entropy
from prime_lab.trainer.model import accumulate_batch_gradients, load_policy


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


def test_batch_gradients_match_a_hand_computation_whole_or_micro_batched(tiny_model_dir: Path) -> None:
    """`accumulate_batch_gradients` on three samples, two of them sharing a prompt (packed, that prompt appears once
    in the row), equals the loss written out per token, sample by sample; micro-batches of 2 and 1 give the same
    gradients as one micro-batch of 3."""
    model = load_policy(tiny_model_dir, lora_r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    generator = torch.Generator().manual_seed(1)
    lora = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():  # random B too, so every LoRA matrix gets a gradient
        for _, param in lora:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    temperature = 0.8
    # prompt tokens (mask 0), then completion tokens (mask 1); one environment token (mask 0) inside sample 1
    # samples 0 and 2 are two rollouts of one prompt (5, 17, 230)
    input_ids = [[5, 17, 230, 41, 9, 77, 300], [12, 8, 99, 4, 150, 61, 62, 63, 70, 2], [5, 17, 230, 88, 3, 19]]
    loss_masks = [[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]
    advantages = [0.75, -0.5, -0.25]
    # sampler logprobs = the model's own minus an offset: ratio e^offset, inside [1/8, 8] except one (e^3 > 8, masked)
    offsets = [[0, 0, 0, 0.2, -0.4, 0.0, 1.0], [0, 0, 0.3, -0.1, 0, 3.0, 0.5, -1.5, 0.1, 0.0],
               [0, 0, 0, 0.1, -0.2, 0.4]]

    def own_logprobs(ids: list[int]) -> torch.Tensor:
        """Logprob of each token after the first, straight from the logits (not through token_logprobs)."""
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1] / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]

    samples = []
    with torch.no_grad():
        for ids, mask, off, adv in zip(input_ids, loss_masks, offsets, advantages, strict=True):
            own = [0.0] + own_logprobs(ids).tolist()
            samples.append(Sample(ids, mask, [(lp - o) if m else 0.0 for lp, o, m in zip(own, off, mask, strict=True)],
                                  adv))

    # by hand: -sum over loss tokens inside the ratio band of ratio * A, over the batch's 14 loss tokens
    model.zero_grad(set_to_none=True)
    hand = torch.zeros(())
    for sample, off in zip(samples, offsets, strict=True):
        lp = own_logprobs(sample.input_ids)
        for t in range(1, len(sample.input_ids)):
            if sample.loss_mask[t] and off[t] <= 2.0:
                hand = hand - torch.exp(lp[t - 1] - sample.sampler_logprobs[t]) * sample.advantage
    hand = hand / 14
    hand.backward()
    hand_grads = {name: p.grad.clone() for name, p in lora if p.grad is not None}
    assert len(hand_grads) == len(lora) and all(g.abs().max() > 0 for g in hand_grads.values())

    for micro_batch_size in (3, 2, 1):
        model.zero_grad(set_to_none=True)
        result = accumulate_batch_gradients(model, samples, device="cpu", temperature=temperature,
                                            micro_batch_size=micro_batch_size)
        assert result.loss == pytest.approx(hand.item(), rel=1e-5), micro_batch_size
        assert result.loss_tokens == 14 and result.masked_fraction == pytest.approx(1 / 14)
        for name, param in lora:
            assert param.grad is not None
            scale = float(hand_grads[name].abs().max())  # float32 sums in another order: 1e-5 of the largest entry
            torch.testing.assert_close(param.grad, hand_grads[name], rtol=1e-4, atol=1e-5 * scale,
                                       msg=f"{name}, micro-batch {micro_batch_size}: gradient differs")


def test_mismatch_kl_ignores_masked_placeholders_and_has_the_sampler_direction() -> None:
    out = policy_loss(torch.tensor([[-100.0, -1.0, -2.0]]), torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([1.0]),
                      torch.tensor([[0, 1, 1]]))
    assert out.mismatch_kl == 0.0  # not nan: the prompt position's placeholder is ignored
    x = 0.5  # log(p_trainer / p_sampler) on the one loss token
    out = policy_loss(torch.tensor([[-1.0 + x]]), torch.tensor([[-1.0]]), torch.tensor([0.0]), torch.tensor([[1]]))
    assert out.mismatch_kl == pytest.approx(math.exp(x) - x - 1, rel=1e-6)


def test_k3_is_never_negative_and_exact_near_zero() -> None:
    """exp(x) - x - 1 in float32 rounds to -6e-8 for |x| ~ 1e-4 (a step-1 `policy/kl` of -1.8e-10 was logged)."""
    import torch

    from prime_lab.trainer.loss import k3

    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 1e-4
    got = k3(x)
    exact = x.double().exp() - x.double() - 1
    assert float(got.min()) >= 0.0
    assert float((got.double() - exact).abs().max()) < 1e-10
    assert float(k3(torch.tensor([2.0]))) == pytest.approx(math.exp(2.0) - 3.0, rel=1e-6)
