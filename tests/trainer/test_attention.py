"""How packed rows attend (trainer/attention.py): FlexAttention's mask_mod is the packing mask, padding stays apart,
a forward through FlexAttention on the CPU equals the dense-mask forward and the unpacked samples, and the CPU keeps
SDPA."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from prime_lab.trainer.attention import (
    choose_attention,
    default_row_tokens,
    padded_length,
    row_inputs,
    row_structure,
    visibility,
)
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.model import load_policy
from prime_lab.trainer.packing import PackedRow, pack


def _batch(vocab: int, seed: int = 0) -> list[Sample]:
    """Three clusters (two groups of three sharing a prompt, one with a prompt of its own), completions of several
    lengths, one with an environment token inside it that is an input but not trained."""
    rng = random.Random(seed)
    samples = []
    for group, size in ((0, 3), (1, 3), (2, 1)):
        prompt = [rng.randrange(vocab) for _ in range(5 + 2 * group)]
        for i in range(size):
            completion = [rng.randrange(vocab) for _ in range(3 + 2 * i)]
            mask = [0] * len(prompt) + [1] * len(completion)
            if i == 2:
                mask[len(prompt) + 1] = 0
            samples.append(Sample(prompt + completion, mask, [0.0] * len(mask), 1.0))
    return samples


def _dense(mask_mod: object, length: int) -> torch.Tensor:
    return create_mask(mask_mod, None, None, length, length, device="cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("per_row", [None, 4, 2])
def test_the_mask_mod_is_the_packing_mask(per_row: int | None) -> None:
    rows = pack(_batch(100), per_row)
    assert max(r.samples for r in rows) > 1 and max(len(set(r.block)) for r in rows) > 1  # several clusters a row
    for row in rows:
        block, part = row_structure(row, len(row), "cpu")
        assert torch.equal(_dense(visibility(block, part), len(row)), row.attention_mask("cpu"))


def test_padding_sees_only_padding_and_nothing_sees_it() -> None:
    row = pack(_batch(100), None)[0]
    length = padded_length(len(row))
    assert length % 128 == 0 and length > len(row)
    block, part = row_structure(row, length, "cpu")
    mask = _dense(visibility(block, part), length)[0, 0]
    real, pad = slice(0, len(row)), slice(len(row), length)
    assert torch.equal(mask[real, real], row.attention_mask("cpu")[0, 0])
    assert not mask[real, pad].any() and not mask[pad, real].any()
    assert torch.equal(mask[pad, pad], torch.ones(length - len(row), length - len(row)).tril().bool())


def test_row_lengths_are_rounded_to_few_shapes() -> None:
    assert [padded_length(n) for n in (1, 128, 129, 1000, 1025, 12800, 16384)] == \
        [128, 128, 256, 1024, 2048, 13312, 16384]
    assert len({padded_length(n) for n in range(1025, 16385)}) == 15


def _unpacked_logprobs(model: torch.nn.Module, samples: list[Sample]) -> list[float]:
    """Each trained token's logprob from its own sample, run alone (plain causal attention)."""
    out = []
    for s in samples:
        logits = model(input_ids=torch.tensor([s.input_ids])).logits[0].float()  # type: ignore[operator]
        logprobs = torch.log_softmax(logits, dim=-1)
        out += [float(logprobs[t - 1, s.input_ids[t]]) for t in range(1, len(s.input_ids)) if s.loss_mask[t]]
    return out


def _row_logprobs(model: torch.nn.Module, rows: list[PackedRow], attention: str) -> list[float]:
    out = []
    for row in rows:
        logits = model(**row_inputs(model, row, "cpu", attention)).logits[0].float()  # type: ignore[operator]
        out += torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(row.targets)[:, None])[:, 0].tolist()
    return out


@torch.no_grad()
def test_a_flex_forward_on_the_cpu_equals_the_dense_mask_and_the_unpacked_samples(tiny_model_dir: Path) -> None:
    """FlexAttention's forward runs on a CPU (compiled by transformers; its backward does not): through the tiny
    model, packed rows with several clusters and padding give each trained token the logprob of the dense-mask
    forward and of its sample run alone."""
    model = load_policy(tiny_model_dir)
    samples = _batch(model.config.vocab_size)
    rows = pack(samples, 4)
    assert any(len(r) % 128 for r in rows)  # padding is exercised
    unpacked = _unpacked_logprobs(model, samples)
    dense = _row_logprobs(model, rows, "sdpa")
    model.get_base_model().set_attn_implementation("flex_attention")
    flex = _row_logprobs(model, rows, "flex")
    # the rows hold the trained tokens in sample order, as the unpacked loop does
    assert len(flex) == len(dense) == len(unpacked) == sum(sum(s.loss_mask) for s in samples)
    assert flex == pytest.approx(dense, abs=1e-5)
    assert flex == pytest.approx(unpacked, abs=1e-5)


def test_the_cpu_keeps_sdpa_and_says_so_only_when_flex_was_asked_for(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    assert choose_attention("auto", "cpu", model) == ("sdpa", None)
    assert choose_attention("sdpa", "cpu", model) == ("sdpa", None)
    attention, note = choose_attention("flex", "cpu", model)
    assert attention == "sdpa" and note is not None and "no backward pass on a CPU" in note
    assert model.config._attn_implementation == "sdpa"
    assert default_row_tokens("cpu") == 1024


def test_a_run_asking_for_flex_on_a_cpu_trains_through_sdpa_and_says_so_once(tiny_model_dir: Path) -> None:
    """The Trainer takes `[trainer] attention` and `lm_head_chunk_size` from the config: flex asked for on a CPU
    falls back to SDPA with one warning in the log, and the dense head trains as the chunked one does (the same
    loss, entropy and gradient norm at step 1, and close after it: Adam's first steps amplify float rounding)."""
    from tests.support.trainer_runs import (
        STEPS,
        base_batches,
        config_text,
        new_run,
        train,
        trainer_log,
        trainer_metrics,
    )

    batches = base_batches(tiny_model_dir, STEPS)
    published, logs = [], []
    for extra in ('attention = "flex"\n', "lm_head_chunk_size = 0\n"):
        run = new_run(tiny_model_dir, config_text(tiny_model_dir) + extra, batches)
        train(run, tiny_model_dir)
        logs.append(trainer_log(run))
        published.append(trainer_metrics(run))
    flex_log, dense_log = logs
    warnings = [m for level, m in flex_log if level == "WARNING"]
    assert len(warnings) == 1 and "FlexAttention is not used (FlexAttention has no backward pass on a CPU)" \
        in warnings[0], flex_log
    ready = [m for _, m in flex_log + dense_log if m.startswith("trainer ready")]
    assert "rows of up to 1024 tokens through SDPA with a dense mask, LM head 1024 tokens a chunk" in ready[0]
    assert "LM head whole (lm_head_chunk_size = 0)" in ready[1]
    assert sorted(published[0]) == sorted(published[1]) == list(range(1, STEPS + 1))
    for step, chunked in published[0].items():
        for name in ("loss", "policy/entropy", "optim/grad_norm", "policy/kl"):
            tolerance = 1e-5 if step == 1 else 1e-2
            assert published[1][step][name] == pytest.approx(chunked[name], rel=tolerance, abs=1e-6), (step, name)
