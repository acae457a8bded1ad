"""The chunked LM head (trainer/lm_head.py) against the dense one: logprobs, entropy and gradients under temperature
and top_p, a float64 gradcheck, chunk sizes, and the trainer's batch path through a real model with each head."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.lm_head import chosen_logprobs, nucleus_threshold, sampled_logprobs, sampling_logits
from prime_lab.trainer.model import accumulate_batch_gradients, load_full_policy, load_policy

SETTINGS = [(t, p) for t in (0.7, 1.0, 1.3) for p in (1.0, 0.9)]


def _case(n: int, d: int, vocab: int, temperature: float, top_p: float, dtype: torch.dtype = torch.float32,
          seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states, a head weight and, as a sampler draws them, targets inside each position's nucleus."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, d, generator=gen, dtype=dtype) * 0.7).requires_grad_()
    with torch.no_grad():
        probs = torch.softmax(sampling_logits(hidden @ weight.T, temperature, top_p), dim=-1)
    targets = torch.multinomial(probs.float(), 1, generator=gen).squeeze(-1)
    return hidden, weight, targets


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
def test_chunked_head_equals_the_dense_one(temperature: float, top_p: float) -> None:
    hidden, weight, targets = _case(300, 32, 2000, temperature, top_p)
    upstream = torch.randn(300, generator=torch.Generator().manual_seed(1))
    logprob, entropy = sampled_logprobs(hidden, weight, targets, temperature, top_p, chunk_size=64)
    grads = torch.autograd.grad((logprob * upstream).sum(), (hidden, weight))
    dense, dense_entropy = chosen_logprobs((hidden @ weight.T)[None], targets[None], temperature, top_p,
                                           with_entropy=True)
    dense_grads = torch.autograd.grad((dense[0] * upstream).sum(), (hidden, weight))
    assert dense_entropy is not None and torch.isfinite(dense).all()
    torch.testing.assert_close(logprob, dense[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, dense_entropy[0], rtol=0, atol=1e-5)
    for got, want in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    if top_p < 1.0:  # the nucleus really cut the distribution: entropy below the unnucleated one
        full = chosen_logprobs((hidden @ weight.T)[None], targets[None], temperature, 1.0, with_entropy=True)[1]
        assert full is not None and bool((entropy < full[0] - 1e-3).all())


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.0, 0.9), (1.3, 0.8)])
def test_chunked_head_gradients_pass_gradcheck(temperature: float, top_p: float) -> None:
    hidden, weight, targets = _case(7, 5, 13, temperature, top_p, dtype=torch.float64)

    def logprob(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return sampled_logprobs(h, w, targets, temperature, top_p, chunk_size=3)[0]

    assert torch.autograd.gradcheck(logprob, (hidden, weight))


def test_chunk_size_one_equals_one_chunk() -> None:
    hidden, weight, targets = _case(40, 16, 500, 0.7, 0.9)
    results = []
    for chunk in (1, 40, 4096):
        logprob, entropy = sampled_logprobs(hidden, weight, targets, 0.7, 0.9, chunk_size=chunk)
        results.append((logprob.detach(), entropy, *torch.autograd.grad(logprob.sum(), (hidden, weight))))
    for other in results[1:]:
        for got, want in zip(other, results[0], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_nucleus_threshold_keeps_what_the_sampler_keeps() -> None:
    from prime_lab.inference.nucleus import keep_top_p

    logits = torch.randn(50, 300, generator=torch.Generator().manual_seed(3)) * 3
    for top_p in (0.1, 0.5, 0.9, 0.999):
        kept = ~keep_top_p(logits, top_p).isneginf()
        assert torch.equal(logits >= nucleus_threshold(logits, top_p)[:, None], kept)
        assert bool(kept.sum(-1).min() >= 1)


def test_greedy_temperature_zero_is_plain_softmax() -> None:
    hidden, weight, targets = _case(20, 8, 50, 1.0, 1.0)
    greedy = sampled_logprobs(hidden, weight, targets, 0.0, 0.5)[0]
    plain = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(greedy, plain)


@torch.no_grad()
def _rl_batch(model: torch.nn.Module, temperature: float, top_p: float, seed: int = 0) -> list[Sample]:
    """Two groups of three sharing a prompt, completions of different lengths drawn from the model as a sampler
    draws them (every token inside its nucleus), advantages of both signs, sampler logprobs a little off the
    policy's."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr, arg-type]
    samples = []
    for _group in range(2):
        prompt = [rng.randrange(vocab) for _ in range(9)]
        for i in range(3):
            ids = list(prompt)
            for _ in range(5 + 3 * i):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                probs = torch.softmax(sampling_logits(logits, temperature, top_p), dim=-1)
                ids.append(int(torch.multinomial(probs, 1, generator=gen)))
            mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
            samples.append(Sample(ids, mask, [-7.0 * m for m in mask], 0.5 if i % 2 else -0.7))
    return samples


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_batch_path_gives_the_same_loss_and_gradients_with_either_head(tiny_model_dir: Path,
                                                                           lora: bool) -> None:
    """The trainer's micro-batch loop, the KL reference pass included, through the chunked head (chunks smaller
    than a row) and through the dense head: the same loss, metrics and gradients."""
    torch.manual_seed(0)
    if lora:
        model, reference = load_policy(tiny_model_dir), None
        for name, param in model.named_parameters():  # a non-zero adapter, so the reference pass differs
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.05)
    else:
        model = load_full_policy(tiny_model_dir)
        reference = load_full_policy(tiny_model_dir, trainable=False)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.01)
    samples = _rl_batch(model, 0.7, 0.9)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    results, grads = [], []
    for chunk in (4, 0):
        model.zero_grad(set_to_none=True)
        results.append(accumulate_batch_gradients(model, samples, device="cpu", temperature=0.7, top_p=0.9,
                                                  micro_batch_size=4, kl_beta=0.1, reference=reference,
                                                  lm_head_chunk_size=chunk))
        grads.append({n: p.grad.clone() for n, p in params if p.grad is not None})
    chunked, dense = results
    assert chunked.loss == pytest.approx(dense.loss, rel=1e-5, abs=1e-7)
    assert chunked.entropy == pytest.approx(dense.entropy, rel=1e-5)
    assert chunked.ref_kl is not None and dense.ref_kl is not None and dense.ref_kl > 0
    assert chunked.ref_kl == pytest.approx(dense.ref_kl, rel=1e-4)
    assert chunked.mismatch_kl == pytest.approx(dense.mismatch_kl, rel=1e-5)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name, want in grads[1].items():
        torch.testing.assert_close(grads[0][name], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()),
                                   msg=f"{name}: gradient differs")


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.9), (0.7, 0.8), (1.3, 0.5)])
def test_bf16_ties_at_the_nucleus_edge_give_the_builtin_sampler_logprobs(temperature: float, top_p: float) -> None:
    """In bfloat16 many logits are equal, often at the nucleus edge: the built-in sampler (inference/builtin/
    sampling.py) and the head keep the same tokens there (inference/nucleus.py's one rule), so the head's logprob of
    each drawn token is the sampler's own."""
    from prime_lab.inference.builtin.sampling import RowSampling, SamplingParams, sample

    n, vocab = 256, 4096
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, 64, generator=gen).bfloat16()
    weight = (torch.randn(vocab, 64, generator=gen) * 0.4).bfloat16()
    logits = torch.nn.functional.linear(hidden, weight).float()  # as the sampler gets them from a bf16 model
    torch.manual_seed(0)
    params = SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p, logprobs=True)
    drawn = sample(logits, RowSampling.build([params] * n, [None] * n, torch.device("cpu")))
    # the case under test: rows whose nucleus ends inside a run of equal logits
    ordered = (logits / temperature).sort(dim=-1, descending=True).values
    probs = torch.softmax(ordered, dim=-1)
    prefix = ((probs.cumsum(-1) - probs) <= top_p).sum(-1, keepdim=True)
    tied = (ordered.gather(1, prefix) == ordered.gather(1, prefix - 1)).squeeze(1)
    assert int(tied.sum()) > 20
    for chunk in (n, 7):
        logprob = sampled_logprobs(hidden, weight, drawn.tokens, temperature, top_p, chunk_size=chunk)[0]
        torch.testing.assert_close(logprob, drawn.logprobs, rtol=0, atol=5e-6)
    dense = chosen_logprobs(logits[None], drawn.tokens[None], temperature, top_p)[0][0]
    torch.testing.assert_close(dense, drawn.logprobs, rtol=0, atol=5e-6)
