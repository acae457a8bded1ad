"""The running batch: its sequences and the tensors that go with them, kept row-aligned.

`attention_mask` [B, L] matches the KV cache's L columns (0 on left padding); `next_positions` [B] is the
position id of each row's next input token (the count of its real tokens so far); `last_tokens` [B] are the
tokens sampled last step, fed in this step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prime_lab.inference.builtin.adapters import ServedModel
from prime_lab.inference.builtin.kv_cache import BatchKVCache, pad_left
from prime_lab.inference.builtin.sampling import RowSampling
from prime_lab.inference.builtin.sequences import Sequence


@dataclass
class DecodeBatch:
    model: ServedModel
    sequences: list[Sequence]
    cache: BatchKVCache
    attention_mask: torch.Tensor
    next_positions: torch.Tensor
    last_tokens: torch.Tensor
    sampling: RowSampling

    def __len__(self) -> int:
        return len(self.sequences)

    @staticmethod
    def row_sampling(sequences: list[Sequence], device: torch.device) -> RowSampling:
        return RowSampling.build([s.params for s in sequences], [s.pending.generator for s in sequences], device)

    def banned_tokens(self, vocab_size: int) -> torch.Tensor | None:
        return banned_stop_tokens(self.sequences, vocab_size, self.last_tokens.device)

    def join(self, other: DecodeBatch) -> None:
        """Append `other`'s rows (same model), left-padding the shorter history."""
        length = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        self.cache.join(other.cache)
        self.attention_mask = torch.cat(
            [pad_left(self.attention_mask, length, 1), pad_left(other.attention_mask, length, 1)]
        )
        self.next_positions = torch.cat([self.next_positions, other.next_positions])
        self.last_tokens = torch.cat([self.last_tokens, other.last_tokens])
        self.sequences = self.sequences + other.sequences
        self.sampling = self.row_sampling(self.sequences, self.last_tokens.device)

    def drop_finished(self) -> bool:
        """Remove finished or abandoned rows; False when none are left."""
        keep = live_rows(self.sequences)
        if len(keep) == len(self.sequences):
            return True
        if not keep:
            self.sequences = []
            return False
        index = torch.tensor(keep, device=self.last_tokens.device)
        mask = self.attention_mask[index]
        used_columns = mask.any(dim=0).nonzero()
        drop_left = int(used_columns[0]) if len(used_columns) else 0
        self.cache.select_rows(index, drop_left)
        self.attention_mask = mask[:, drop_left:]
        self.next_positions = self.next_positions[index]
        self.last_tokens = self.last_tokens[index]
        self.sequences = [self.sequences[i] for i in keep]
        self.sampling = self.row_sampling(self.sequences, self.last_tokens.device)
        return True


def live_rows(sequences: list[Sequence]) -> list[int]:
    """The rows of a batch that go on decoding: neither finished nor abandoned by their client."""
    return [i for i, s in enumerate(sequences) if not s.finished and not s.pending.abandoned]


def banned_stop_tokens(sequences: list[Sequence], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """[B, V] True where a row may not sample the token now (stop tokens under `min_tokens`); None for none."""
    rows = [(i, s) for i, s in enumerate(sequences) if s.wants_banned_stops]
    if not rows:
        return None
    banned = torch.zeros((len(sequences), vocab_size), dtype=torch.bool, device=device)
    for i, sequence in rows:
        ids = [t for t in sequence.stop_token_ids if t < vocab_size]
        banned[i, ids] = True
    return banned
