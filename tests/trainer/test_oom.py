"""Memory that never surprises: on a GPU the trainer settles its row budget and activation checkpointing at the
first batch from the memory free then (an estimate from the model's shape, calibrated to what was measured on an
H100), says so in its log, and a CUDA out-of-memory error ends the run with one line naming the settings to change,
never a traceback in the run's reason. Driven on the CPU, with torch.cuda's memory queries faked where a GPU is
needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prime_lab.runs.registry import Run
from prime_lab.trainer.model import ModelShape, model_shape, plan_memory
from prime_lab.trainer.runtime import guarded_main, load_config, out_of_memory_message
from tests.support.trainer_runs import base_batches, config_text, new_run, trainer_log

GIB = 2**30
# Qwen3-0.6B's shape, bfloat16, and its peaks on an H100 (shared/notes/one-gpu.md): one 16k row, LoRA r16 on every
# linear layer, the LM head 1,024 tokens a chunk
QWEN3_06B = ModelShape(hidden=1024, intermediate=3072, layers=28, vocab=151936, dtype_bytes=2,
                       trainable_bytes=10_092_544 * 4)  # peft keeps adapters in float32
QWEN3_06B_WEIGHTS = 596_049_920 * 2
MEASURED_16K_GIB = {(False, False): 43.5, (False, True): 31.3, (True, False): 4.85, (True, True): 4.85}


def _plan(available_gib: float, **settings: Any) -> Any:
    return plan_memory(QWEN3_06B, available=int(available_gib * GIB), total=80 * GIB, compiled=True, **settings)


@pytest.mark.parametrize(("checkpointed", "compiled"), list(MEASURED_16K_GIB))
def test_the_estimate_is_at_least_what_was_measured_and_not_far_above(checkpointed: bool, compiled: bool) -> None:
    estimate = (QWEN3_06B.step_bytes(16384, checkpointed=checkpointed, compiled=compiled, head_chunk=1024)
                + QWEN3_06B_WEIGHTS) / GIB
    measured = MEASURED_16K_GIB[checkpointed, compiled]
    assert measured <= estimate <= 1.6 * measured, (estimate, measured)


def test_the_plan_follows_the_free_memory() -> None:
    """Plenty free: rows of 16,384 tokens without checkpointing; under 40 GiB: 8,192; too little for those: the same
    rows with checkpointing; too little even so: the budget halves (never below 1,024)."""
    roomy, shared, tight, scarce = _plan(70), _plan(30), _plan(12), _plan(4.7)
    assert (roomy.row_tokens, roomy.checkpointing) == (16384, False) and roomy.need <= roomy.available
    assert (shared.row_tokens, shared.checkpointing) == (8192, False)
    assert (tight.row_tokens, tight.checkpointing) == (8192, True) and tight.need_plain > tight.available
    assert tight.need <= tight.available < tight.need_plain
    assert (scarce.row_tokens, scarce.checkpointing, scarce.shrunk_from) == (4096, True, 8192)
    assert scarce.need <= scarce.available
    assert _plan(0.1).row_tokens == 1024
    assert "activation checkpointing on (auto)" in tight.describe()
    assert "rows of up to 8192 tokens would need ~" in tight.describe()
    assert "12.0 GiB of 80.0 GiB free" in tight.describe()
    assert "activation checkpointing off (auto)" in roomy.describe()
    assert "(not 8192: too little memory)" in scarce.describe()


def test_settings_given_are_kept_and_a_plan_that_cannot_fit_says_so() -> None:
    assert _plan(70, checkpointing=True).checkpointing
    off = _plan(12, checkpointing=False)  # no checkpointing: the budget halves instead
    assert (off.checkpointing, off.row_tokens) == (False, 2048) and off.need <= off.available
    fixed = _plan(12, row_tokens=16384, checkpointing=False, others=30 * GIB)
    assert (fixed.row_tokens, fixed.checkpointing) == (16384, False) and fixed.need > fixed.available
    said = fixed.describe()
    assert "may run out of memory" in said and "set [trainer] activation_checkpointing = true" in said
    assert "other processes hold 30.0 GiB" in said and "[inference] gpu_memory_utilization" in said
    long = _plan(70, longest=40000)  # a sample longer than the budget takes a row of its own
    assert long.planned == 40000 and long.checkpointing and "the longest sample, 40000, alone" in long.describe()


def test_the_shape_comes_from_the_model_config(tiny_model_dir: Path, tiny_moe_model_dir: Path) -> None:
    from prime_lab.trainer.model import load_policy

    dense = model_shape(load_policy(tiny_model_dir), trainable_bytes=123)
    assert (dense.hidden, dense.intermediate, dense.layers, dense.dtype_bytes, dense.trainable_bytes) == \
        (64, 128, 2, 4, 123)
    moe = load_policy(tiny_moe_model_dir, target_modules=["q_proj"])
    width = getattr(moe.config, "moe_intermediate_size", None) or moe.config.intermediate_size
    assert model_shape(moe).intermediate == width * moe.config.num_experts_per_tok  # the active experts' width


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, free: int, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)


def _trainer(model_dir: Path, extra: str = "") -> Any:
    from prime_lab.trainer.train import Trainer

    run = new_run(model_dir, config_text(model_dir) + extra, base_batches(model_dir, 1))
    return Trainer(run, load_config(run), model_dir)


@pytest.mark.parametrize("tight", [True, False], ids=["tight", "roomy"])
def test_the_trainer_plans_at_the_first_batch_on_a_gpu(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tight: bool) -> None:
    """The Trainer (on a faked GPU) leaves rows and checkpointing open until its first batch, then reads the free
    memory: checkpointing goes on (on the model) only when the first batch's rows would not fit without it, and the
    log gives the numbers."""
    trainer = _trainer(tiny_model_dir)
    batch = base_batches(tiny_model_dir, 1)[0]
    shape = model_shape(trainer.model, sum(p.numel() * p.element_size() for p in trainer.params))
    with_it = shape.step_bytes(8192, checkpointed=True, compiled=False, head_chunk=1024)
    without = shape.step_bytes(8192, checkpointed=False, compiled=False, head_chunk=1024)
    free = (with_it + without) // 2 if tight else 50 * GIB
    _fake_cuda(monkeypatch, free, 80 * GIB)
    trainer.device, trainer.plan_pending = "cuda", True
    trainer.plan_rows(batch)
    trainer.plan_rows(batch)  # once only
    plan = trainer.memory_plan
    assert plan is not None and plan.available == free and plan.checkpointing is tight
    assert trainer.row_tokens == (8192 if tight else 16384)
    assert trainer.checkpointing is tight and trainer.model.is_gradient_checkpointing is tight
    said = [m for _, m in trainer_log(trainer.run) if m.startswith("memory at the first batch")]
    assert len(said) == 1 and f"rows of up to {trainer.row_tokens} tokens" in said[0]
    assert ("activation checkpointing on (auto)" if tight else "activation checkpointing off (auto)") in said[0]


# out of memory -----------------------------------------------------------------------------------------------------
def test_the_out_of_memory_line_names_the_settings_that_apply() -> None:
    line = out_of_memory_message(step=3, free=int(41 * GIB), total=80 * GIB, others=36 * GIB, row_tokens=16384,
                                 when=" at the first batch")
    assert line == ("CUDA out of memory at step 3 (41.0 GiB free of 80.0 GiB at the first batch): lower [trainer] "
                    "micro_batch_tokens (now 16384), set [trainer] activation_checkpointing = true, or lower "
                    "[inference] gpu_memory_utilization")
    alone = out_of_memory_message(step=3, free=int(41 * GIB), total=80 * GIB, others=0, row_tokens=8192,
                                  checkpointing=True)
    assert alone.endswith(": lower [trainer] micro_batch_tokens (now 8192)")


TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
             "1.02 GiB is free.\nIncluding non-PyTorch memory, this process has 78.08 GiB memory in use. If "
             "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def _fatal(run: Run) -> list[str]:
    return [m for level, m in trainer_log(run) if level == "ERROR"]


def test_guarded_main_turns_torchs_out_of_memory_into_one_line(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = new_run(tiny_model_dir, config_text(tiny_model_dir), [])
    _fake_cuda(monkeypatch, GIB, 80 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def body() -> int:
        raise torch.OutOfMemoryError(TORCH_OOM)

    assert guarded_main(run, "trainer", body) == 1
    (reason,) = _fatal(run)
    assert reason == ("trainer failed: CUDA out of memory (1.0 GiB free of 80.0 GiB now): set [trainer] "
                      "micro_batch_tokens lower, set [trainer] activation_checkpointing = true, or lower [inference] "
                      "gpu_memory_utilization")
    out = capsys.readouterr()
    assert "Traceback" in out.err + out.out and "Tried to allocate" in out.err + out.out  # the process log keeps it


def test_a_step_out_of_memory_ends_the_run_with_one_line(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's step raising torch's OutOfMemoryError (the real class, as a GPU raises it): the run's reason is
    one line with the step, the memory of the plan and the row budget in force; the traceback is not in it."""
    import prime_lab.trainer.train as train_module

    def out_of_memory(*_: Any, **__: Any) -> Any:
        raise torch.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(train_module, "accumulate_batch_gradients", out_of_memory)
    trainer = _trainer(tiny_model_dir)
    assert guarded_main(trainer.run, "trainer", trainer.train) == 1
    (reason,) = _fatal(trainer.run)
    assert reason == ("trainer failed: CUDA out of memory at step 1: lower [trainer] micro_batch_tokens (now 1024), "
                      "set [trainer] activation_checkpointing = true, or lower [inference] gpu_memory_utilization")

    gpu = _trainer(tiny_model_dir)  # on a (faked) GPU, with the plan made at the first batch
    _fake_cuda(monkeypatch, 30 * GIB, 80 * GIB)
    gpu.device, gpu.plan_pending = "cuda", True
    assert guarded_main(gpu.run, "trainer", gpu.train) == 1
    (reason,) = _fatal(gpu.run)
    assert "\n" not in reason and "Traceback" not in reason and "PYTORCH_CUDA_ALLOC_CONF" not in reason
    assert reason.startswith("trainer failed: CUDA out of memory at step 1 (30.0 GiB free of 80.0 GiB at the first "
                             "batch): lower [trainer] micro_batch_tokens (now 8192)")
