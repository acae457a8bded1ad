"""Nothing of a run outlives its supervisor, however the supervisor ends (restart contract, DESIGN.md).

The RL supervisor starts a reaper: a small process in a session of its own (so a `kill -9` of the run's process
group does not reach it) that holds the read end of a pipe whose only write end the supervisor keeps (children are
started with `close_fds`, so none inherits it). A supervisor that finishes normally writes one byte before it
exits and the reaper leaves quietly. Any other end of the supervisor (SIGKILL, a crash, the machine's OOM killer)
closes the pipe with nothing written: the reaper then SIGKILLs the run's process group (trainer, orchestrator,
torchrun workers), every registered process and the process group each one leads (the sampler runs in its own
group, with vLLM's engine core beside it), and records the run as `failed` within a second, so `prime rl restart`
works on it directly.

`die_with_parent` is the second guard, for the supervisor's direct children: Linux's parent-death signal.

    python -P -m prime_lab.runs.reaper RUN_DIR --fd N
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from prime_lab.runs.paths import child_python
from prime_lab.runs.registry import FINAL_STATES, Run

DONE = b"x"  # what a supervisor that ends normally writes
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For `Popen(preexec_fn=...)`: the child gets SIGKILL when the thread that started it exits (Linux; a no-op
    elsewhere). Use it only where that thread is the parent's main thread."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


class ReaperHandle:
    """The supervisor's side: the pipe's write end and the reaper process."""

    def __init__(self, write_fd: int, process: subprocess.Popen[bytes]) -> None:
        self.write_fd = write_fd
        self.process = process

    def release(self) -> None:
        """The supervisor is ending normally: the reaper leaves without touching anything."""
        if self.write_fd < 0:
            return
        try:
            os.write(self.write_fd, DONE)
        except OSError:
            pass
        os.close(self.write_fd)
        self.write_fd = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_reaper(run: Run) -> ReaperHandle:
    """Start the reaper of `run` (call it from the supervisor, before starting any child)."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, False)
    with open(run.log_path("reaper"), "ab") as log:
        process = subprocess.Popen([*child_python(), "-m", "prime_lab.runs.reaper", str(run.dir), "--fd", str(read_fd)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   pass_fds=(read_fd,), start_new_session=True)
    os.close(read_fd)
    return ReaperHandle(write_fd, process)


def watch(run: Run, read_fd: int) -> int:
    """Block until the supervisor ends; clean up after it if it did not end normally."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        try:
            message = pipe.read(1)
        except OSError:
            message = b""
    if message == DONE:
        return 0
    status = run.read_status()
    supervisor = (status.get("processes") or {}).get("launcher", {}).get("pid")
    left = run.end_processes()
    if status.get("state") not in FINAL_STATES:
        reason = (f"the supervisor (pid {supervisor}) was killed or crashed; every process of the run was ended. "
                  f"Resume from the newest checkpoint: prime {status.get('kind') or 'rl'} restart {run.id}")
        run.set_state("failed", reason=reason)
    print("reaper: supervisor gone; ended the run's processes" + (f" (still alive: {left})" if left else ""),
          flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_lab.runs.reaper")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `prime rl stop` signals the run's group, not this session
    return watch(Run(args.run_dir), args.fd)


if __name__ == "__main__":
    sys.exit(main())
