"""The SFT and on-policy distillation losses: cross-entropy against torch's own, through the packed batch path on
the tiny model; the opd advantage and its gradient direction; teacher/kl as the mean of sampler - teacher logprob,
a stale batch's included."""

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


def test_on_policy_teacher_kl_is_the_mean_of_student_minus_teacher(tiny_model_dir: Path) -> None:
    from prime_lab.trainer.model import token_logprobs

    model = load_policy(tiny_model_dir, lora_r=4, target_modules=["q_proj"])
    batch = samples(teacher=True)
    want, n = 0.0, 0
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            student, _ = token_logprobs(model, ids, torch.ones_like(ids))
            s.sampler_logprobs = student[0].tolist()  # on-policy: the student sampled
            for t, on in enumerate(s.loss_mask):
                if on:
                    want += float(student[0, t]) - s.teacher_logprobs[t]  # type: ignore[index]
                    n += 1
    result = accumulate_batch_gradients(model, batch, device="cpu", loss="opd")
    assert result.teacher_kl == pytest.approx(want / n, abs=1e-4)
    with pytest.raises(ValueError, match="no teacher logprobs"):
        accumulate_batch_gradients(model, samples(), device="cpu", loss="opd")


def test_teacher_kl_is_the_sampling_policys_kl_to_the_teacher_when_the_batch_is_two_versions_stale(
        tiny_model_dir: Path) -> None:
    """Off-policy (max_async_level 2, the default): the batch was sampled by the policy two versions back, so the
    trainer's logprobs are not the sampler's. teacher/kl is KL(sampler || teacher) on the sampler's own tokens: the
    mean of sampler - teacher logprob over the loss tokens. The trainer's logprobs in its place give that minus the
    mismatch KL (about: 0.72 where the KL was 1.75, two versions stale, in the review)."""
    from prime_lab.trainer.model import token_logprobs

    torch.manual_seed(0)
    model = load_policy(tiny_model_dir, lora_r=4, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    adapter = [p for name, p in model.named_parameters() if "lora_" in name]

    def update() -> None:  # one policy version further
        with torch.no_grad():
            for p in adapter:
                p.add_(torch.randn_like(p) * 2.0)

    batch = samples(seed=1)
    update()
    with torch.no_grad():  # version k - 2 samples, and the teacher (the base model) scores its tokens
        for s in batch:
            ids = torch.tensor([s.input_ids])
            s.sampler_logprobs = token_logprobs(model, ids, torch.ones_like(ids))[0][0].tolist()
            with model.disable_adapter():
                s.teacher_logprobs = token_logprobs(model, ids, torch.ones_like(ids))[0][0].tolist()
    update()  # versions k - 1 and k: the trainer's policy is two updates on
    update()
    result = accumulate_batch_gradients(model, batch, device="cpu", loss="opd")
    sampled = current = 0.0
    n = 0
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            trainer = token_logprobs(model, ids, torch.ones_like(ids))[0][0]
            for t, on in enumerate(s.loss_mask):
                if on:
                    sampled += s.sampler_logprobs[t] - s.teacher_logprobs[t]  # type: ignore[index]
                    current += float(trainer[t]) - s.teacher_logprobs[t]  # type: ignore[index]
                    n += 1
    assert abs(sampled - current) / n > 0.05  # the case under test: the trainer's policy is not the sampler's
    assert result.mismatch_kl > 0.01
    assert result.teacher_kl == pytest.approx(sampled / n, abs=1e-5)
