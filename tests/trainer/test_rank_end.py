"""The launcher ends a torchrun whose run has written its final output but one of whose ranks does not exit (rarely,
a rank hangs in gloo's teardown once rank 0 has exited, and torchrun waits on it for ever): trainer/launcher.py
`RANKS_END_S`. torchrun and its stuck rank are real processes here, a parent sleeping on a sleeping child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.distributed import Topology
from prime_lab.trainer.sft_config import validate_sft_config
from tests.support.sft_runs import write_dataset, write_sft_config

STUCK_TORCHRUN = ("import subprocess, sys, time; "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_ranks_still_running_after_the_final_model_are_ended(tiny_model_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "RANKS_END_S", 1.0)
    config = write_sft_config(tmp_path / "sft.toml", tiny_model_dir, write_dataset(tmp_path / "chats.jsonl"), steps=2,
                              extra="[trainer]\nnproc_per_node = 2\n")
    result = validate_sft_config(config.read_text())
    assert result.config is not None, result.problems
    run = RunRegistry().create("sft", config_text=config.read_text(), resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(tiny_model_dir))
    run.model_dir.mkdir()  # an earlier attempt's model: not this one's final output
    os.utime(run.model_dir, (time.time() - 60, time.time() - 60))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    torchrun = subprocess.Popen([sys.executable, "-c", STUCK_TORCHRUN])
    try:
        supervisor = launcher.Supervisor(run)
        supervisor.topology = Topology(nproc_per_node=2)
        supervisor.children["trainer"] = torchrun
        deadline = time.monotonic() + 30
        while not launcher.worker_pids(torchrun.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [rank] = launcher.worker_pids(torchrun.pid)
        final: list[str] = []

        def watch() -> None:
            try:
                final.append(supervisor.watch())
            except Exception as exc:  # shown by the assertions below
                final.append(repr(exc))

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        time.sleep(3 * launcher.RANKS_END_S)  # the final model not yet written: the launcher waits on torchrun
        assert not final and torchrun.poll() is None and not gone(rank)

        run.update_status(step=2)  # what rank 0 does before it exits: its last step, then the model folder
        os.utime(run.model_dir)
        watching.join(timeout=30)
        assert final == ["completed"]
        assert torchrun.poll() is not None
        deadline = time.monotonic() + 10
        while not gone(rank):  # SIGKILLed: it dies when next scheduled
            assert time.monotonic() < deadline, f"rank {rank} is still running"
            time.sleep(0.05)
        warnings = [e.data["message"] for e in run.event_log().events()
                    if e.kind == "log" and e.data.get("level") == "WARNING"]
        assert any(f"trainer rank(s) {rank} still running 1 s after" in w for w in warnings), warnings
    finally:
        torchrun.kill()
        for pid in launcher.worker_pids(torchrun.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        torchrun.wait()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
