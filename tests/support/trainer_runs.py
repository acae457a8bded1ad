"""Helpers of the trainer tests that run the `Trainer` class on batches written the way the orchestrator writes
them: a tiny-model config (full fine-tuning unless changed), batches with the base model's logprobs (what a sampler
serving version 0 reports), a run holding them, and readers of what the trainer wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.batch import Sample, write_batch
from prime_lab.trainer.config import validate_rl_config

STEPS = 3
CONFIG = """model = "{model}"
max_steps = {steps}
batch_size = 4
rollouts_per_example = 2
learning_rate = 1e-3
{extra}
[sampling]
max_tokens = 5

[[env]]
id = "tiny-chars"

[lora]
enabled = false

[checkpoints]
interval = 1

[trainer]
micro_batch_size = 2
"""


def config_text(model: Path, steps: int = STEPS, extra: str = "") -> str:
    return CONFIG.format(model=model, steps=steps, extra=extra)


def random_batch(vocab: int) -> list[Sample]:
    """4 samples of 24 random tokens (8 of prompt, 16 trained), advantages of both signs, sampler logprobs -4."""
    import random

    rng = random.Random(0)
    samples = []
    for i in range(4):
        ids = [rng.randrange(vocab) for _ in range(24)]
        mask = [0] * 8 + [1] * 16
        samples.append(Sample(ids, mask, [-4.0 * m for m in mask], 1.0 if i % 2 else -0.5))
    return samples


def base_batches(model_dir: Path, steps: int) -> list[list[Sample]]:
    """`steps` batches of 4 samples (2 groups of 2 sharing a prompt), logprobs from the base model."""
    import torch

    from prime_lab.trainer.model import load_full_policy, token_logprobs

    model = load_full_policy(model_dir, trainable=False)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(steps):
        samples = []
        for _group in range(2):
            prompt = torch.randint(0, vocab, (6,), generator=generator).tolist()
            for advantage in (1.0, -1.0):
                ids = prompt + torch.randint(0, vocab, (5,), generator=generator).tolist()
                with torch.no_grad():
                    logprobs, _ = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids)))
                mask = [0] * len(prompt) + [1] * 5
                samples.append(Sample(input_ids=ids, loss_mask=mask, advantage=advantage,
                                      sampler_logprobs=[lp * m for lp, m in zip(logprobs[0].tolist(), mask,
                                                                                 strict=True)]))
        batches.append(samples)
    return batches


def new_run(model_dir: Path, text: str, batches: list[list[Sample]]) -> Run:
    result = validate_rl_config(text)
    assert result.ok and result.config is not None, [p.format() for p in result.problems]
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(model_dir))
    for step, samples in enumerate(batches, start=1):
        write_batch(run.rollouts_dir, step, samples)
    return run


def train(run: Run, model_dir: Path, *, resume: bool = False) -> Any:
    from prime_lab.trainer.runtime import load_config
    from prime_lab.trainer.train import Trainer

    trainer = Trainer(run, load_config(run), model_dir, resume=resume)
    assert trainer.train() == 0
    return trainer


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def trainer_metrics(run: Run) -> dict[int, dict[str, float]]:
    return {e.step: e.data for e in run.event_log().events()
            if e.kind == "metrics" and e.source == "trainer" and e.step is not None}


def trainer_log(run: Run) -> list[tuple[str, str]]:
    """The trainer's log lines of `run`, as (level, message)."""
    return [(e.data["level"], e.data["message"]) for e in run.event_log().events()
            if e.kind == "log" and e.source == "trainer"]
