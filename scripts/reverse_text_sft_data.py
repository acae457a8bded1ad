"""Write reverse-text's SFT data: training chats and held-out validation chats in the `messages` shape.

    .venv/bin/python scripts/reverse_text_sft_data.py          # rewrites configs/sft/data/reverse-text{,-val}.jsonl

The rows are `prime_lab.envs.builtin.reverse_text.sft_rows`: the environment's training examples (seed 0) with the
reply its reward scores 1.0. They never meet the environment's eval split, which `prime eval run` and an RL run's
`[eval]` score (the same seed-0 sequence of distinct phrases: the training examples are its first rows, the eval
split starts at row 1,000). The validation rows come from another seed, with every phrase that is also a training
phrase or an eval phrase dropped. Deterministic: tests/test_configs.py checks that the committed files are what
this writes, and bench/sft_then_rl.py writes its own sizes with `write_reverse_text_data`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "configs" / "sft" / "data"
NUM_TRAIN, NUM_VAL = 400, 50
TRAIN_SEED, VAL_SEED = 0, 1


def _phrase(messages: list[dict[str, Any]]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def reverse_text_sft_data(num_train: int = NUM_TRAIN, num_val: int = NUM_VAL) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]:
    """(training rows, validation rows): `num_train` of the environment's training examples (at most 1,000, so
    none is an eval example), and `num_val` rows of another seed whose phrases are in neither."""
    from prime_lab.envs.builtin.reverse_text import load_environment, sft_rows

    if not 1 <= num_train <= 1000:
        raise ValueError("num_train must be 1..1000: past 1,000 the seed-0 rows are the environment's eval split")
    train = sft_rows(num_train, seed=TRAIN_SEED)
    evaluated = load_environment().get_eval_dataset()
    taken = {_phrase(r["messages"]) for r in train} | {_phrase(r["prompt"]) for r in evaluated}
    val = [r for r in sft_rows(num_val + 100, seed=VAL_SEED) if _phrase(r["messages"]) not in taken][:num_val]
    if len(val) < num_val:
        raise ValueError(f"only {len(val)} validation phrases are new; ask for fewer")
    return train, val


def to_jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def write_reverse_text_data(folder: Path, num_train: int = NUM_TRAIN, num_val: int = NUM_VAL) -> tuple[Path, Path]:
    """Write `reverse-text.jsonl` and `reverse-text-val.jsonl` into `folder`; return their paths."""
    train, val = reverse_text_sft_data(num_train, num_val)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "reverse-text.jsonl", folder / "reverse-text-val.jsonl"
    for path, rows in zip(paths, (train, val), strict=True):
        path.write_text(to_jsonl(rows))
    return paths


def main() -> int:
    for path in write_reverse_text_data(DATA):
        print(f"{path.relative_to(ROOT)}: {len(path.read_text().splitlines())} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
