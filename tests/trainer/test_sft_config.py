"""The SFT config: prime-rl's SFT configs validate as they are, each setting's two spellings fold into one, both at
once is a problem on its line, and the template names every field."""

from __future__ import annotations

from prime_lab.trainer.sft_config import (
    CkptConfig,
    DataConfig,
    LossMaskConfig,
    OptimConfig,
    SFTValConfig,
    template_path,
    validate_sft_config,
)
from tests.trainer.test_template import uncomment_settings

# prime-rl's examples/basic/reverse-text/sft.toml (its SFT part) and examples/debug/ci/sft.toml, as published
PRIME_RL_REVERSE_TEXT = """max_steps = 10

[ckpt] # Checkpoint at the end of training

[model]
name = "Qwen/Qwen3.5-0.8B"

[data]
name = "PrimeIntellect/Reverse-Text-SFT"
seq_len = 4096
batch_size = 32

[optim]
lr = 2e-5
"""
PRIME_RL_CI = """max_steps = 40

[model]
name = "PrimeIntellect/Qwen3-0.6B"

[data]
name = "PrimeIntellect/Reverse-Text-SFT"
batch_size = 16
micro_batch_size = 8
seq_len = 128

[optim]
lr = 2e-5
"""
PRIME_RL_WORDLE = """max_steps = 20

[ckpt] # Checkpoint at the end of training

[model]
name = "PrimeIntellect/Qwen3-1.7B"

[data]
seq_len = 1024
batch_size = 64
micro_batch_size = 1

[[data.source]]
dataset = "willcb/V3-wordle"

[optim]
lr = 1e-5"""


def test_prime_rls_sft_configs_validate_and_fold_into_our_fields() -> None:
    for text, model, lr, seq_len in ((PRIME_RL_REVERSE_TEXT, "Qwen/Qwen3.5-0.8B", 2e-5, 4096),
                                     (PRIME_RL_CI, "PrimeIntellect/Qwen3-0.6B", 2e-5, 128),
                                     (PRIME_RL_WORDLE, "PrimeIntellect/Qwen3-1.7B", 1e-5, 1024)):
        result = validate_sft_config(text, "sft.toml")
        assert result.errors == [], [p.format() for p in result.errors]
        cfg = result.config
        assert cfg is not None and cfg.model.name == model and cfg.learning_rate == lr and cfg.data.seq_len == seq_len
    wordle = validate_sft_config(PRIME_RL_WORDLE).config
    assert wordle is not None and [s.dataset for s in wordle.data.datasets] == ["willcb/V3-wordle"]
    assert wordle.data.datasets[0].splits == ["train"]


def test_our_spellings_and_prime_rls_mean_the_same() -> None:
    ours = validate_sft_config("""model = "m"\nmax_steps = 3\nlearning_rate = 3e-5\n[data]\nname = "d.jsonl"\n
[lora]\nr = 4\n[checkpoints]\ninterval = 7\nkeep_cloud = 2\n[wandb]\nproject = "p"\n
[trainer]\nweight_decay = 0.1\nmax_grad_norm = 0.5\n""").config
    theirs = validate_sft_config("""max_steps = 3\n[model]\nname = "m"\n[model.lora]\nr = 4\n[data]\nname = "d.jsonl"\n
[optim]\nlr = 3e-5\nweight_decay = 0.1\nmax_norm = 0.5\n[ckpt]\ninterval = 7\nkeep_last = 2\n
[monitors.wandb]\nproject = "p"\n""").config
    assert ours is not None and theirs is not None
    for a, b in ((ours.learning_rate, theirs.learning_rate), (ours.lora, theirs.lora),
                 (ours.checkpoints, theirs.checkpoints), (ours.wandb, theirs.wandb),
                 (ours.trainer.weight_decay, theirs.trainer.weight_decay),
                 (ours.trainer.max_grad_norm, theirs.trainer.max_grad_norm), (ours.model.name, theirs.model.name)):
        assert a == b


def test_both_spellings_at_once_is_a_problem_on_its_line() -> None:
    text = 'max_steps = 3\nlearning_rate = 1e-4\n[model]\nname = "m"\n[data]\nname = "d.jsonl"\n[optim]\nlr = 2e-5\n'
    result = validate_sft_config(text, "sft.toml")
    assert [p.format() for p in result.errors] == [
        "sft.toml:8: optim.lr: learning_rate and optim.lr both set the learning rate: keep one"]


def test_mistakes_name_the_file_line_and_field() -> None:
    result = validate_sft_config('model = "m"\nmax_steps = 0\n[data]\nname = "d.jsonl"\nseq_len = "long"\n'
                                 '[data.loss_mask]\nassistant = true\nuser = 1\n[data.losmask]\n', "sft.toml")
    found = {(p.line, p.key) for p in result.errors}
    assert found == {(2, "max_steps"), (5, "data.seq_len"), (8, "data.loss_mask.user"), (9, "data.losmask")}
    assert any(p.suggestion == "loss_mask" for p in result.errors)


def test_a_row_shorter_than_seq_len_and_a_missing_dataset_are_reported() -> None:
    result = validate_sft_config('model = "m"\nmax_steps = 3\n[data]\nseq_len = 2048\n[trainer]\n'
                                 "micro_batch_tokens = 1024\n", "sft.toml")
    assert [p.key for p in result.errors] == ["trainer.micro_batch_tokens"]
    assert [p.key for p in result.notes] == ["data"]  # no dataset named: prime-rl's default, from the Hub cache


def test_template_validates_and_shows_every_sft_field() -> None:
    """The template validates as printed and with every setting on, and shows each field SFT adds (the [trainer]
    and [lora] ones are the RL template's)."""
    text = template_path().read_text()
    assert validate_sft_config(text).problems == []
    assert validate_sft_config(uncomment_settings(text)).errors == []
    shown = {line.lstrip("# ").split("=")[0].strip() for line in text.splitlines() if "=" in line}
    headers = [line.lstrip("# ") for line in text.splitlines()]
    sections = {h.split("]")[0] + "]" for h in headers if h.startswith("[")}
    tables = ("source", "data", "loss_mask")
    for model in (DataConfig, LossMaskConfig, SFTValConfig, OptimConfig, CkptConfig):
        missing = [name for name in model.model_fields if name not in shown and name not in tables]
        assert not missing, (model.__name__, missing)
    assert {"max_steps", "learning_rate", "warmup_steps", "checkpoint_id"} <= shown
    assert {"[data]", "[data.loss_mask]", "[[data.source]", "[val]", "[val.data]", "[lora]", "[optim]",
            "[checkpoints]", "[ckpt]", "[wandb]", "[trainer]", "[model]"} <= sections, sections
