"""What the run's processes (launcher, orchestrator, trainer) share: the config, the adapter and checkpoint folders,
and a stop flag set by SIGTERM/SIGINT.

Steps are counted from 1. The batch of step k is `rollouts/step_k.jsonl`; the trainer's adapter after step k is
`adapters/step_k/` (policy version k; version 0 is the base model, or the warm-start / resume adapter), and a
resumable checkpoint after step k is `checkpoints/step_k/` (the adapter plus `trainer_state.pt`). Folders appear
whole: they are written under a temporary name and renamed (runs/atomic.py's `publish_folder`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run
from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.sft_config import SFTConfig

STEP_DIR = re.compile(r"^step_(\d+)$")
ADAPTER_NAME = "policy"  # the name the orchestrator loads the trainer's adapter under


def load_config(run: Run) -> RLConfig:
    return RLConfig.model_validate(json.loads(run.resolved_path.read_text()), strict=False)


def load_sft_config(run: Run) -> SFTConfig:
    return SFTConfig.model_validate(json.loads(run.resolved_path.read_text()), strict=False)


def load_run_config(run: Run) -> RLConfig | SFTConfig:
    """The run's validated config, by its kind (an RL or an SFT run)."""
    return load_sft_config(run) if run.read_status().get("kind") == "sft" else load_config(run)


def step_dirs(root: Path) -> dict[int, Path]:
    """Complete `step_N` folders under `root`, by N."""
    out: dict[int, Path] = {}
    if root.is_dir():
        for child in root.iterdir():
            m = STEP_DIR.match(child.name)
            if m and child.is_dir():
                out[int(m.group(1))] = child
    return out


def latest_step(root: Path) -> int | None:
    steps = step_dirs(root)
    return max(steps) if steps else None


def link_or_copy(src: str, dst: str) -> None:
    """A hard link of `src` at `dst` (a file written whole and never changed in place), or a copy where the file
    system has no links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def checkpoint_to_resume(run: Run) -> tuple[int, Path] | None:
    """The newest complete checkpoint of a run: (step, folder)."""
    steps = step_dirs(run.checkpoints_dir)
    complete = {k: v for k, v in steps.items() if (v / "trainer_state.pt").is_file()}
    if not complete:
        return None
    step = max(complete)
    return step, complete[step]


def warm_start_adapter(checkpoint_id: str, runs_root: Path) -> Path:
    """`checkpoint_id` as a local folder: a checkpoints/step_N or adapters/step_N folder, or a run id (its newest
    checkpoint). Raises ValueError with what to do."""
    path = Path(checkpoint_id).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file():
        return path
    run_dir = runs_root / checkpoint_id
    if run_dir.is_dir():
        found = checkpoint_to_resume(Run(run_dir))
        if found:
            return found[1]
        raise ValueError(f"checkpoint_id: run {checkpoint_id} has no checkpoint yet (checkpoints/step_N)")
    raise ValueError(f"checkpoint_id: {checkpoint_id!r} is neither a run id under {runs_root} nor a folder with an "
                     "adapter_config.json (a run's checkpoints/step_N or adapters/step_N)")


class StopFlag:
    """Set by SIGTERM or SIGINT; the process finishes what it is doing, saves, and exits."""

    def __init__(self) -> None:
        self.set = False
        self.signal: int | None = None

    def install(self) -> StopFlag:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.set = True
        self.signal = signum


def log_both(events: EventWriter, message: str, level: str = "INFO", step: int | None = None) -> None:
    """A process's log line: a `log` event for every view, and the same line in its own log file (stdout)."""
    events.log(message, level, step=step)
    print(f"[{events.source}] {level} {message}", flush=True)


class OutOfMemory(RuntimeError):
    """The GPU ran out of memory during a step: the message is one line naming the settings to change
    (`out_of_memory_message`)."""


def out_of_memory_message(*, step: int | None = None, free: int | None = None, total: int | None = None,
                          others: int | None = None, row_tokens: int | None = None, checkpointing: bool = False,
                          when: str = "") -> str:
    """One line for a CUDA out-of-memory error: where, the memory (`free` of `total` bytes, `when`), and the settings
    that lower what a step needs: the row budget, activation checkpointing (when off), and the sampler's share of
    the card (when other processes hold memory on it, or that is not known)."""
    gib = 2**30
    where = f" at step {step}" if step is not None else ""
    memory = f" ({free / gib:.1f} GiB free of {total / gib:.1f} GiB{when})" if free is not None and total else ""
    fixes = [f"lower [trainer] micro_batch_tokens (now {row_tokens})" if row_tokens
             else "set [trainer] micro_batch_tokens lower"]
    if not checkpointing:
        fixes.append("set [trainer] activation_checkpointing = true")
    if others is None or others >= gib:
        fixes.append("lower [inference] gpu_memory_utilization")
    said = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]
    return f"CUDA out of memory{where}{memory}: {said}"


def failure_reason(exc: BaseException) -> str:
    """An exception as the run's reason: one line for running out of GPU memory (torch's own message is long and
    advises allocator settings), else its type and message."""
    if isinstance(exc, OutOfMemory):
        return str(exc)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        free = total = None
        try:
            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info()
        except RuntimeError:
            pass
        return out_of_memory_message(free=free, total=total, when=" now" if free is not None else "")
    return f"{type(exc).__name__}: {exc}"


def guarded_main(run: Run, role: str, body: Callable[[], int], who: str | None = None) -> int:
    """Run a process's body; an exception becomes an ERROR event (the reason the launcher reports: `failure_reason`)
    and exit code 1, with the traceback in the process's own log (its stdout)."""
    try:
        return body()
    except Exception as exc:
        traceback.print_exc()
        message = f"{who or role} failed: {failure_reason(exc)}"
        try:
            with run.writer(role) as writer:
                writer.log(message, "ERROR", fatal=True)
        except OSError:
            pass
        print(message, file=sys.stderr, flush=True)
        return 1
