"""`prime rl run` with `[lora] enabled = false` end to end: the trainer trains every weight, publishes the whole
model as `weights/step_N/` each step, the orchestrator loads each version into the running sampler in place, and a
run stopped after a checkpoint resumes with `prime rl restart`. Tiny learnable model, real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.runs.registry import Run
from prime_lab.trainer.runtime import step_dirs
from tests.support.rl_runs import (
    fixture_envs,
    logs,
    metrics,
    prime,
    rewards,
    start,
    wait_final,
    wait_step,
    write_config,
)

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # the autouse fixture: the run's processes find the test environment

FULL_FT_LR = 1e-3  # the tiny random model needs far more than the ~1e-6 a pretrained one does


def full_config(path: Path, model: Path, **fields: object) -> Path:
    write_config(path, model, lr=FULL_FT_LR, **fields)  # type: ignore[arg-type]
    path.write_text(path.read_text().replace("[lora]\n", "[lora]\nenabled = false\n"))
    return path


def weights_dir(run: Run) -> Path:
    return run.dir / "weights"


def test_full_finetuning_publishes_weights_checkpoints_and_resumes(learnable_model_dir: Path, tmp_path: Path) -> None:
    """max_async_level 0: every batch is sampled with exactly the weights the trainer had after the step before,
    so the mismatch KL stays at float32 noise; a sampler that kept its old weights would show the policy moving."""
    run = start(full_config(tmp_path / "rl.toml", learnable_model_dir, steps=8, async_level=0,
                            checkpoint_interval=2))
    wait_step(run, 3)
    assert prime("rl", "stop", run.id, "--grace", "120").returncode == 0
    status = wait_final(run)
    assert status["state"] == "stopped", status.get("reason", "") + logs(run)
    stopped_at = int(status["step"])
    checkpoint = run.checkpoints_dir / f"step_{stopped_at}"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "trainer_state.pt").is_file()
    assert not (checkpoint / "adapter_config.json").exists()
    assert not step_dirs(run.adapters_dir)

    proc = prime("rl", "restart", run.id, "--foreground")
    assert proc.returncode == 0, proc.stderr + logs(run)
    status = run.status()
    assert status["state"] == "completed" and status["step"] == 8, status.get("reason", "") + logs(run)
    trainer, orchestrator = metrics(run, "trainer"), metrics(run, "orchestrator")
    assert sorted(trainer) == list(range(1, 9))  # nothing trained twice, nothing skipped
    assert [orchestrator[k]["policy/version"] for k in sorted(orchestrator)] == list(range(8))
    assert max(trainer[k]["policy/kl"] for k in trainer) < 1e-3, {k: trainer[k]["policy/kl"] for k in trainer}
    assert sorted(step_dirs(weights_dir(run)))[-1] == 8
    assert (weights_dir(run) / "step_8" / "config.json").is_file()
    assert len(rewards(run)) == 8


def test_vllm_backend_takes_the_trainers_weights(learnable_model_dir: Path, tmp_path: Path) -> None:
    """The same on the real vLLM (CPU build): started without LoRA and with our worker extension, it takes each
    version through /collective_rpc; on-policy every step, so the mismatch KL shows whether it really did."""
    run = start(full_config(tmp_path / "rl.toml", learnable_model_dir, steps=5, backend="vllm", async_level=0))
    status = wait_final(run, timeout=540)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    trainer, orchestrator = metrics(run, "trainer"), metrics(run, "orchestrator")
    assert [orchestrator[k]["policy/version"] for k in sorted(orchestrator)] == [0, 1, 2, 3, 4]
    assert max(trainer[k]["policy/kl"] for k in trainer) < 1e-3, {k: trainer[k]["policy/kl"] for k in trainer}
    assert rewards(run)[-1] != rewards(run)[0]
