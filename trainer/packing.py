"""Micro-batches packed into single sequences: each group's prompt once, every completion after it, no padding.

The rollouts of a group start with the same prompt, token for token. A packed row holds, for every *cluster* of
samples sharing a prefix (the tokens before their first trained token), that prefix once and then each sample's
remainder. An attention mask lets a remainder see its own cluster's prefix and itself (causally), nothing else, and
its position ids continue from the prefix's length, so every trained token gets the logprob it has in its own
unpacked sequence (up to float summation order). A group of 8 rollouts then costs its prompt once instead of 8
times, and no position is padding; logits are computed only at the positions that predict a trained token.

Rows hold at most `per_row` samples (`[trainer] micro_batch_size`, when set) and `max_tokens` tokens (`[trainer]
micro_batch_tokens`: trainer/attention.py says what fits where), and a row with one sample needs no mask at all.
Pure Python; `attention_mask` builds the tensor (trainer/attention.py builds FlexAttention's block mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prime_lab.trainer.batch import Sample

if TYPE_CHECKING:
    import torch

MAX_ROW_TOKENS = 4096  # when no budget is given; a longer single sample still gets a row of its own


@dataclass
class PackedRow:
    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    block: list[int] = field(default_factory=list)  # which prefix (cluster segment) each position belongs to
    part: list[int] = field(default_factory=list)  # 0: that prefix; k > 0: the k-th remainder in the row
    # one entry per trained token, in order: the row position whose logits predict it, the token, and its sample's
    # sampler logprob and advantage (and, for on-policy distillation, the teacher's logprob)
    sources: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    teacher_logprobs: list[float] = field(default_factory=list)
    samples: int = 0
    sample_tokens: int = 0  # tokens of the unpacked samples (what the row stands for)

    def __len__(self) -> int:
        return len(self.input_ids)

    def add_prefix(self, prefix: list[int]) -> None:
        self.block += [self.block[-1] + 1 if self.block else 0] * len(prefix)
        self.part += [0] * len(prefix)
        self.input_ids += prefix
        self.position_ids += list(range(len(prefix)))

    def add_remainder(self, sample: Sample, prefix_len: int, prefix_start: int) -> None:
        """Sample tokens prefix_len.. as inputs after the current prefix (its last token predicts nothing, so it is
        left out), and its trained tokens' sources."""
        ids, mask = sample.input_ids, sample.loss_mask
        start = len(self.input_ids)
        inputs = ids[prefix_len:-1]
        part = self.samples + 1
        self.block += [self.block[-1]] * len(inputs)
        self.part += [part] * len(inputs)
        self.input_ids += inputs
        self.position_ids += list(range(prefix_len, prefix_len + len(inputs)))
        for t in range(prefix_len, len(ids)):
            if mask[t]:
                before = t - 1  # the position that predicts token t
                self.sources.append(prefix_start + before if before < prefix_len else start + before - prefix_len)
                self.targets.append(ids[t])
                self.sampler_logprobs.append(float(sample.sampler_logprobs[t]))
                self.advantages.append(float(sample.advantage))
                if sample.teacher_logprobs is not None:
                    self.teacher_logprobs.append(float(sample.teacher_logprobs[t]))
        self.samples += 1
        self.sample_tokens += len(ids)

    def needs_mask(self) -> bool:
        return self.samples > 1

    def attention_mask(self, device: str | torch.device) -> torch.Tensor:
        """[1, 1, T, T] bool, True where a query position may attend a key position (every position sees itself,
        so no row of the mask is empty)."""
        import torch

        block = torch.tensor(self.block, device=device)
        part = torch.tensor(self.part, device=device)
        position = torch.arange(len(self.block), device=device)
        causal = position[None, :] <= position[:, None]
        same_block = block[None, :] == block[:, None]
        visible = (part[None, :] == 0) | (part[None, :] == part[:, None])
        return (causal & same_block & visible)[None, None]


def prefix_length(sample: Sample) -> int:
    """Tokens before the sample's first trained token (at least 1: position 0 has nothing before it to predict it);
    0 for a sample with nothing to train."""
    for t in range(1, len(sample.loss_mask)):
        if sample.loss_mask[t]:
            return t
    return 0


def single_row(sample: Sample, prefix_len: int) -> PackedRow:
    row = PackedRow()
    row.add_prefix(sample.input_ids[:prefix_len])
    row.add_remainder(sample, prefix_len, 0)
    return row


def pack(samples: list[Sample], per_row: int | None, accumulation_steps: int = 1, *, share_prefixes: bool = True,
         max_tokens: int = MAX_ROW_TOKENS) -> list[PackedRow]:
    """Rows of at most `per_row` samples (None: no cap; fewer when that makes at least `accumulation_steps` rows)
    and at most `max_tokens` tokens (a longer sample gets a row of its own); samples with the same prefix go
    together and share it when `share_prefixes` (otherwise every row holds one sample, which any attention
    implementation can run). Samples with no trained token are left out."""
    trainable = [(s, prefix_length(s)) for s in samples]
    trainable = [(s, p) for s, p in trainable if p > 0]
    if not trainable:
        return []
    if not share_prefixes:
        return [single_row(sample, p) for sample, p in trainable]
    at_least_rows = -(-len(trainable) // max(1, accumulation_steps)) if accumulation_steps > 1 else len(trainable)
    per_row = max(1, min(per_row or len(trainable), at_least_rows))
    clusters: dict[tuple[int, ...], list[Sample]] = {}
    for sample, p in trainable:
        clusters.setdefault(tuple(sample.input_ids[:p]), []).append(sample)
    rows: list[PackedRow] = []
    row = PackedRow()
    for prefix, members in clusters.items():
        prefix_start = -1  # where this cluster's prefix sits in the current row (-1: not in it yet)
        for sample in members:
            remainder = len(sample.input_ids) - 1 - len(prefix)
            cost = remainder + (len(prefix) if prefix_start < 0 else 0)
            if row.samples and (row.samples >= per_row or len(row) + cost > max_tokens):
                rows.append(row)
                row, prefix_start = PackedRow(), -1
            if prefix_start < 0:
                prefix_start = len(row)
                row.add_prefix(list(prefix))
            row.add_remainder(sample, len(prefix), prefix_start)
    rows.append(row)
    return rows
