"""Hosted Training configs run unchanged: settings Hosted fixes per cluster are not demanded locally."""

from __future__ import annotations

from prime_lab.trainer.config import validate_rl_config

HOSTED = """model = "Qwen/Qwen3-4B-Instruct-2507"
max_steps = 100
batch_size = 256
rollouts_per_example = 8

[sampling]
max_tokens = 8192

[[env]]
id = "primeintellect/alphabet-sort"
"""


def test_long_max_tokens_validate_without_a_local_seq_len() -> None:
    result = validate_rl_config(HOSTED)
    assert result.ok, [p.format() for p in result.problems]
    assert result.config is not None and result.config.trainer.max_seq_len is None


def test_an_explicit_local_seq_len_must_hold_max_tokens() -> None:
    result = validate_rl_config(HOSTED + "\n[trainer]\nmax_seq_len = 4096\n")
    assert [(p.line, p.key) for p in result.errors] == [(7, "sampling.max_tokens")]
