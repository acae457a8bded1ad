"""`prime rl run` with `[trainer] nproc_per_node = 2`: the launcher runs the trainer under torchrun (2 gloo ranks on
this CPU). The run completes with every event, adapter and checkpoint written once (by rank 0), and a rank that dies
fails the run within seconds, as a dead single trainer does."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from prime_lab.trainer.launcher import worker_pids
from prime_lab.trainer.runtime import step_dirs
from tests.support.rl_runs import fixture_envs, logs, metrics, start, wait_final, wait_step, write_config

__all__ = ["fixture_envs"]  # autouse: the run's processes find the test environment

pytestmark = pytest.mark.slow

TWO_RANKS = "\n[trainer]\nnproc_per_node = 2\nmicro_batch_size = 4\n"


def test_two_trainer_processes_complete_a_run_writing_everything_once(learnable_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=3, async_level=1,
                             checkpoint_interval=2, extra=TWO_RANKS))
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    events = [e for e in run.event_log().events() if e.source == "trainer"]
    assert sorted(e.step for e in events if e.kind == "metrics") == [1, 2, 3]  # once per step: rank 0 alone
    assert sorted(e.step for e in events if e.kind == "checkpoint") == [2, 3]
    ready = [e.data["message"] for e in events if e.kind == "log" and "trainer ready" in e.data["message"]]
    assert len(ready) == 1 and "x 2 ranks (DDP, gloo)" in ready[0], ready
    assert sorted(step_dirs(run.adapters_dir)) == [1, 2, 3] and sorted(step_dirs(run.checkpoints_dir)) == [2, 3]
    assert not [p for root in (run.adapters_dir, run.checkpoints_dir) for p in root.iterdir()
                if p.name.startswith(".")]  # no rank left a staging folder
    assert "2 processes under torchrun" in run.log_path("launcher").read_text()
    trained = metrics(run, "trainer")
    assert all(m["optim/grad_norm"] > 0 and m["train/samples"] == 16 for m in trained.values()), trained


def test_a_dead_rank_fails_the_run_within_seconds(learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=200, extra=TWO_RANKS))
    wait_step(run, 1, timeout=240)
    torchrun = run.read_status()["processes"]["trainer"]["pid"]
    ranks = worker_pids(torchrun)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    t0 = time.monotonic()
    status = wait_final(run, timeout=90)
    assert time.monotonic() - t0 < 45, logs(run)  # torchrun ends the other rank, the launcher sees it exit
    assert status["state"] == "failed" and "trainer" in status["reason"], status
    assert not run.live_processes()
