"""The run registry with real processes: status, stop (graceful and escalated), dead runs, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prime_lab.runs.registry import Run, RunError, RunRegistry, pid_alive

# A stand-in run process (the thing under test is the registry, not this script): it registers itself, says it
# is running, and on SIGTERM either records a clean stop or, with "stubborn", ignores the signal. Like the trainer's
# stop flag, the handler only notes the signal and the loop does the writing: a handler that wrote itself would wait
# forever on the event log's flock when SIGTERM came while set_state("running") still held it (CI saw that once).
RUN_PROCESS = """
import os, signal, sys, time
from prime_lab.runs.registry import Run
run = Run(sys.argv[1])
mode = sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum) if mode != "stubborn" else None)
run.register_process("trainer", os.getpid(), pgid=os.getpgid(0))
run.set_state("running", source="trainer")
while not stop:
    time.sleep(0.05)
run.writer("trainer").log("checkpoint saved, exiting")
run.set_state("stopped", source="trainer", reason="stopped by the user")
"""


def make_run(registry: RunRegistry) -> Run:
    return registry.create("rl", config_text="model = 'x'\n", resolved={"model": "x"}, model="x",
                           envs=["primeintellect/reverse-text"], max_steps=10)


def start(run: Run, mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", RUN_PROCESS, str(run.dir), mode], start_new_session=True)
    deadline = time.monotonic() + 30
    while run.read_status().get("state") != "running":
        assert time.monotonic() < deadline, "the run process never started"
        time.sleep(0.02)
    return proc


def test_create_lays_out_the_run_directory(lab_home: Path) -> None:
    registry = RunRegistry()
    run = make_run(registry)
    assert run.dir.parent == lab_home / "runs"
    assert run.id.startswith("rl-")
    for sub in ("logs", "rollouts", "checkpoints", "adapters"):
        assert (run.dir / sub).is_dir()
    assert run.config_path.read_text() == "model = 'x'\n"
    assert json.loads(run.resolved_path.read_text()) == {"model": "x"}
    assert run.status()["state"] == "queued"
    assert [e.data["state"] for e in run.event_log().events() if e.kind == "status"] == ["queued"]
    assert registry.get(run.id[:5]).id == run.id  # unique prefix


def test_status_writes_are_atomic_and_merge(lab_home: Path) -> None:
    run = make_run(RunRegistry())
    run.update_status(step=3)
    run.update_status(reward=0.5)
    status = run.read_status()
    assert status["step"] == 3 and status["reward"] == 0.5 and status["model"] == "x"
    assert not [p for p in run.dir.iterdir() if p.name.endswith(".tmp")]


def test_graceful_stop_and_idempotence(lab_home: Path) -> None:
    registry = RunRegistry()
    run = make_run(registry)
    proc = start(run, "graceful")
    result = registry.stop(run.id, grace=10)
    assert proc.wait(timeout=10) == 0
    assert result.state == "stopped" and result.signalled and not result.killed
    assert run.status()["reason"] == "stopped by the user"
    messages = [e.data.get("message") for e in run.event_log().events() if e.kind == "log"]
    assert "checkpoint saved, exiting" in messages
    again = registry.stop(run.id)
    assert not again.signalled and "already stopped" in again.message


def test_stop_escalates_to_kill(lab_home: Path) -> None:
    registry = RunRegistry()
    run = make_run(registry)
    proc = start(run, "stubborn")
    result = registry.stop(run.id, grace=0.5)
    proc.wait(timeout=10)
    assert result.killed and result.state == "stopped"
    assert not pid_alive(proc.pid)


def test_a_run_whose_processes_died_shows_failed(lab_home: Path) -> None:
    registry = RunRegistry()
    run = make_run(registry)
    proc = start(run, "graceful")
    os.killpg(proc.pid, 9)
    proc.wait(timeout=10)
    status = run.status()
    assert status["state"] == "failed"
    assert "without a final status" in status["reason"]
    assert run.read_status()["state"] == "failed"  # recorded, not only shown


def test_delete_refuses_an_active_run_without_force(lab_home: Path) -> None:
    registry = RunRegistry()
    run = make_run(registry)
    proc = start(run, "graceful")
    with pytest.raises(RunError, match="stop it first"):
        registry.delete(run.id)
    assert run.dir.exists()
    registry.delete(run.id, force=True)
    proc.wait(timeout=10)
    assert not run.dir.exists()


def test_unknown_and_ambiguous_ids(lab_home: Path) -> None:
    registry = RunRegistry()
    with pytest.raises(RunError, match="no run 'rl-zzz'"):
        registry.get("rl-zzz")
    make_run(registry), make_run(registry)
    with pytest.raises(RunError, match="matches 2 runs"):
        registry.get("rl-")
