"""Compiling, measured: the first step's compile time is its own metric (`time/compile`) and its throughput is left
out, and a graph compiled after the first two steps of a process is counted (`compile/recompiles`) and logged with
torch's reason. Rows of new lengths after the warm-up compile nothing (a length seen a second time is compiled as a
dynamic dimension)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.model import compile_clock
from prime_lab.trainer.train import WARMUP_STEPS, Trainer
from tests.support.trainer_runs import config_text, new_run, train, trainer_metrics


def _timing_of(compiled: bool) -> Any:
    """What `Trainer.step_timing` reads and writes of a trainer, from its first step on."""
    clock = compile_clock()
    assert clock is not None
    logged: list[tuple[str, str]] = []
    return SimpleNamespace(clock=clock, clock_mark=clock.read(), steps_run=0, compiled=compiled, recompiles=0,
                           start_step=0, logged=logged,
                           log=lambda message, level="INFO", step=None: logged.append((level, message)))


def test_compile_time_is_its_own_metric_and_later_compiles_are_counted() -> None:
    """A real torch.compile between the steps: step 1 compiles (time/compile, no throughput), step 2 reuses it,
    step 3 compiles again for a new input dtype (counted, a WARNING with the guard that failed), step 4 nothing."""
    trainer = _timing_of(compiled=True)
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)

    def step(k: int, *inputs: torch.Tensor) -> dict[str, float]:
        for x in inputs:
            double(x)
        return Trainer.step_timing(trainer, k, elapsed=2.0, tokens=100, throughput="perf/train_tokens_per_s")

    first = step(1, torch.ones(3))
    assert first["time/compile"] > 0 and "perf/train_tokens_per_s" not in first and first["time/step"] == 2.0
    second = step(2, torch.ones(3))
    assert second["perf/train_tokens_per_s"] == 50.0 and "time/compile" not in second
    assert "compile/recompiles" not in second  # the warm-up may compile
    assert WARMUP_STEPS == 2
    third = step(3, torch.ones(3, dtype=torch.float64))
    assert third["compile/recompiles"] == 1.0 and third["time/compile"] > 0
    assert third["perf/train_tokens_per_s"] == 50.0  # only a process's first step is left out
    (warning,) = [m for level, m in trainer.logged if level == "WARNING"]
    assert warning.startswith("step 3: torch.compile compiled 1 more graph(s)") and "dtype" in warning, warning
    fourth = step(4, torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert fourth["compile/recompiles"] == 1.0 and "time/compile" not in fourth and len(trainer.logged) == 1


def test_a_first_step_that_compiled_nothing_keeps_its_throughput() -> None:
    """Eager layers (the CPU's default) report step 1's throughput as before."""
    trainer = _timing_of(compiled=False)
    metrics = Trainer.step_timing(trainer, 1, elapsed=4.0, tokens=100, throughput="perf/throughput")
    assert metrics == {"time/step": 4.0, "perf/throughput": 25.0}


def _batch(rng: random.Random, completions: list[int], vocab: int) -> list[Sample]:
    """Groups of 2 sharing a 6-token prompt, one group per completion length (so rows of new lengths)."""
    samples = []
    for length in completions:
        prompt = [rng.randrange(vocab) for _ in range(6)]
        for advantage in (1.0, -1.0):
            ids = prompt + [rng.randrange(vocab) for _ in range(length)]
            samples.append(Sample(ids, [0] * 6 + [1] * length, [0.0] * 6 + [-7.0] * length, advantage))
    return samples


@pytest.mark.slow
def test_compiled_layers_on_rows_of_new_lengths_recompile_nothing_after_the_warm_up(tiny_model_dir: Path) -> None:
    """`compile = true` (the CUDA default, here on the CPU): step 1 reports time/compile and no throughput; every
    step of rows of lengths not seen before after that compiles nothing (`compile/recompiles` stays 0)."""
    rng = random.Random(0)
    vocab = 256
    batches = [_batch(rng, lengths, vocab) for lengths in ([5, 9], [12, 7], [20, 3], [8, 30], [40, 11])]
    extra = "compile = true\nratio_mask_low = 0.0001\nratio_mask_high = 10000.0\n"
    run = new_run(tiny_model_dir, config_text(tiny_model_dir, steps=len(batches)) + extra, batches)
    trainer = train(run, tiny_model_dir)
    assert trainer.compiled
    metrics = trainer_metrics(run)
    assert metrics[1]["time/compile"] > 0 and "perf/train_tokens_per_s" not in metrics[1]
    assert all(metrics[k]["perf/train_tokens_per_s"] > 0 for k in range(2, 6))
    assert [metrics[k]["compile/recompiles"] for k in range(3, 6)] == [0.0, 0.0, 0.0]
    assert all(m["optim/grad_norm"] > 0 for m in metrics.values())
    logs = [e.data["message"] for e in run.event_log().events() if e.kind == "log"]
    assert not [m for m in logs if "torch.compile compiled" in m]
    ready = next(m for m in logs if m.startswith("trainer ready"))
    assert "compiled layers" in ready and "compile = auto" not in ready  # set, not auto
