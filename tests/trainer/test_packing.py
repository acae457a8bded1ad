"""Packing micro-batches into rows: each cluster's prefix once, remainders after it, sources of every trained token,
row limits, and the attention mask (pure logic; the gradients through packed rows are checked against a hand
computation in test_loss.py and against TRL in test_loss_vs_trl.py)."""

from __future__ import annotations

import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.packing import pack, prefix_length


def sample(prompt: list[int], completion: list[int], advantage: float = 0.0) -> Sample:
    ids = prompt + completion
    return Sample(ids, [0] * len(prompt) + [1] * len(completion), [0.0] * len(prompt) + [-0.5] * len(completion),
                  advantage)


def unpacked_predictions(s: Sample) -> list[tuple[tuple[int, ...], int]]:
    """(the tokens the model sees before each trained token, that token), from the sample itself."""
    return [(tuple(s.input_ids[:t]), s.input_ids[t]) for t in range(1, len(s.input_ids)) if s.loss_mask[t]]


def packed_predictions(row, mask: torch.Tensor | None) -> list[tuple[tuple[int, ...], int]]:  # type: ignore[no-untyped-def]
    """The same from a packed row: the tokens the source position attends to (in position order), and the target."""
    out = []
    for source, target in zip(row.sources, row.targets, strict=True):
        visible = range(source + 1) if mask is None else [k for k in range(len(row)) if mask[0, 0, source, k]]
        ordered = sorted(visible, key=lambda k: row.position_ids[k])
        assert [row.position_ids[k] for k in ordered] == list(range(len(ordered)))  # positions 0..n-1, no gaps
        out.append((tuple(row.input_ids[k] for k in ordered), target))
    return out


def test_a_group_shares_its_prompt_once_and_every_token_sees_what_it_saw_unpacked() -> None:
    group = [sample([1, 2, 3], [10, 11, 12], 0.5), sample([1, 2, 3], [20], -0.5), sample([1, 2, 3], [30, 31], 0.0)]
    other = sample([7, 8], [40, 41, 42, 43], 1.0)
    rows = pack([*group, other], per_row=8)
    assert len(rows) == 1
    row = rows[0]
    # prompt 1,2,3 once; remainders without their last token; then the other prompt and its remainder
    assert row.input_ids == [1, 2, 3, 10, 11, 30, 7, 8, 40, 41, 42]
    assert row.samples == 4 and row.sample_tokens == 6 + 4 + 5 + 6
    expected = [p for s in (*group, other) for p in unpacked_predictions(s)]
    assert sorted(packed_predictions(row, row.attention_mask("cpu"))) == sorted(expected)
    assert len(row.targets) == 3 + 1 + 2 + 4
    assert row.advantages == [0.5] * 3 + [-0.5] + [0.0] * 2 + [1.0] * 4
    assert row.sampler_logprobs == [-0.5] * 10


def test_environment_tokens_inside_a_completion_are_inputs_but_not_trained() -> None:
    s = Sample([1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 1], [0.0, 0.0, -1.0, 0.0, -2.0, -3.0], 0.3)
    twin = Sample([1, 2, 3, 9], [0, 0, 1, 1], [0.0, 0.0, -1.0, -4.0], -0.3)
    row = pack([s, twin], per_row=4)[0]
    assert packed_predictions(row, row.attention_mask("cpu")) == unpacked_predictions(s) + unpacked_predictions(twin)
    assert row.sampler_logprobs == [-1.0, -2.0, -3.0, -1.0, -4.0]


def test_row_limits_split_a_group_and_repeat_its_prompt() -> None:
    group = [sample([1, 2, 3], [10 + i, 11]) for i in range(5)]
    rows = pack(group, per_row=2)
    assert [r.samples for r in rows] == [2, 2, 1]
    assert all(r.input_ids[:3] == [1, 2, 3] for r in rows)  # each row has its own copy of the prompt
    assert [r.samples for r in pack(group, per_row=8, accumulation_steps=3)] == [2, 2, 1]
    by_tokens = pack(group, per_row=8, max_tokens=5)  # prompt 3 + 1 input token per rollout: two per row
    assert [r.samples for r in by_tokens] == [2, 2, 1] and max(len(r) for r in by_tokens) <= 5
    long = sample(list(range(1, 20)), [5, 6])
    assert [len(r) for r in pack([long], per_row=8, max_tokens=4)] == [20]  # one sample longer than the limit


def test_single_samples_need_no_mask_and_untrainable_samples_are_left_out() -> None:
    nothing = Sample([1, 2, 3], [0, 0, 0], [0.0] * 3, 1.0)
    first_only = Sample([4, 5], [1, 0], [0.0, 0.0], 1.0)  # position 0 has nothing before it to predict it
    assert prefix_length(nothing) == 0 and prefix_length(first_only) == 0
    assert pack([nothing, first_only], per_row=4) == []
    rows = pack([sample([1, 2], [3, 4]), sample([1, 2], [5])], per_row=4, share_prefixes=False)
    assert [r.input_ids for r in rows] == [[1, 2, 3], [1, 2]] and not any(r.needs_mask() for r in rows)
    assert packed_predictions(rows[0], None) == unpacked_predictions(sample([1, 2], [3, 4]))


def test_rows_fill_up_to_the_token_budget_not_a_sample_count() -> None:
    """The GPU's RL batch: 64 x 2048 tokens in groups of 8 sharing a 512-token prompt. Without a sample cap a
    16k budget takes a whole group (the prompt once and 8 completions: 12,800 tokens) and as much of the next as
    fits; a 4k budget, 2 samples."""
    batch = [sample(list(range(g * 1000, g * 1000 + 512)), [5] * 1536) for g in range(8) for _ in range(8)]
    rows = pack(batch, None, max_tokens=16384)
    assert sum(r.samples for r in rows) == 64 and len(rows) == 7 and rows[0].samples == 10
    assert all(16384 - 1535 < len(r) <= 16384 for r in rows[:-1])  # full: the next completion would not fit
    assert [r.samples for r in pack(batch, None, max_tokens=4096)] == [2] * 32
    assert [r.samples for r in pack(batch, 4, max_tokens=16384)] == [4] * 16  # a cap still caps
    assert len(pack(batch, None, 16, max_tokens=16384)) == 16  # and accumulation steps still split
    assert sum(r.samples for r in pack(batch[:3] + [sample([1], [2] * 20000)], None, max_tokens=4096)) == 4
