"""The SFT and on-policy distillation losses: cross-entropy against torch's own, through the packed batch path on
the tiny model; the opd advantage and its gradient direction; teacher/kl as its mean."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.loss import cross_entropy_loss, distillation_advantages, policy_loss
from prime_lab.trainer.model import accumulate_batch_gradients, load_policy


def test_cross_entropy_is_the_mean_negative_logprob_of_the_trained_tokens() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1], [1, 0, 1]])
    loss = cross_entropy_loss(logprobs, mask)
    assert loss.item() == pytest.approx((2.0 + 0.5 + 0.3 + 1.0) / 4)
    assert cross_entropy_loss(logprobs, mask, num_loss_tokens=8).item() == pytest.approx(3.8 / 8)
    loss.backward()
    assert logprobs.grad is not None and torch.equal(logprobs.grad, -mask / 4)


def test_opd_pushes_up_what_the_teacher_likes_more_and_down_what_it_likes_less() -> None:
    student = torch.tensor([[-2.0, -1.0, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-1.0, -2.0, -3.0]])
    advantages = distillation_advantages(torch.zeros(1, 3), teacher, student)
    assert torch.equal(advantages, torch.tensor([[1.0, -1.0, 0.0]])) and not advantages.requires_grad
    out = policy_loss(student, student.detach(), advantages, torch.ones(1, 3))
    out.loss.backward()
    assert student.grad is not None
    # a gradient step (minus the gradient) raises token 0, lowers token 1, leaves token 2
    assert student.grad[0, 0] < 0 < student.grad[0, 1] and student.grad[0, 2] == 0
    # on-policy it is the gradient of the reverse KL's per-token estimate: d/dl of sum (l - t)^2 / 2 / N
    assert torch.allclose(student.grad, (student.detach() - teacher) / 3)


def samples(seed: int = 0, teacher: bool = False) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(5):
        prompt = [rng.randrange(1, 900) for _ in range(rng.randint(3, 8))]
        reply = [rng.randrange(1, 900) for _ in range(rng.randint(2, 6))]
        ids = prompt + reply
        mask = [0] * len(prompt) + [1] * len(reply)
        lps = [-rng.uniform(0.1, 3.0) for _ in ids] if teacher else None
        out.append(Sample(ids, mask, [0.0] * len(ids), 0.0, teacher_logprobs=lps))
    return out


def test_the_packed_sft_loss_and_gradients_equal_torchs_cross_entropy(tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    model = load_policy(tiny_model_dir, lora_r=4, target_modules=["q_proj", "v_proj"])
    batch = samples()
    model.zero_grad()
    result = accumulate_batch_gradients(model, batch, device="cpu", loss="sft", micro_batch_tokens=24)
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total, count = torch.zeros(()), 0
    for s in batch:  # one sample at a time, unpacked, with torch's cross-entropy over the trained tokens
        ids = torch.tensor([s.input_ids])
        logits = model(input_ids=ids).logits[0, :-1]
        trained = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        total = total + torch.nn.functional.cross_entropy(logits[trained], ids[0, 1:][trained], reduction="sum")
        count += int(trained.sum())
    (total / count).backward()
    assert result.loss == pytest.approx(float(total / count), rel=1e-5)
    assert result.loss_tokens == count and result.teacher_kl is None
    for name, grad in ours.items():
        assert torch.allclose(grad, dict(model.named_parameters())[name].grad, atol=1e-6), name


def test_teacher_kl_is_the_mean_of_student_minus_teacher(tiny_model_dir: Path) -> None:
    from prime_lab.trainer.model import token_logprobs

    model = load_policy(tiny_model_dir, lora_r=4, target_modules=["q_proj"])
    batch = samples(teacher=True)
    result = accumulate_batch_gradients(model, batch, device="cpu", loss="opd")
    want, n = 0.0, 0
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            student, _ = token_logprobs(model, ids, torch.ones_like(ids))
            for t, on in enumerate(s.loss_mask):
                if on:
                    want += float(student[0, t]) - s.teacher_logprobs[t]  # type: ignore[index]
                    n += 1
    assert result.teacher_kl == pytest.approx(want / n, abs=1e-4)
    with pytest.raises(ValueError, match="no teacher logprobs"):
        accumulate_batch_gradients(model, samples(), device="cpu", loss="opd")
