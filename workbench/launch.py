"""ONE launch path for the workbench: start the same detached process as the CLI command for the job.

`prime eval run ...`, `prime rl run @cfg --yes`, `prime sft run @cfg --yes` and `prime gepa run @cfg` all go through
it. The child runs in its own session (`start_new_session=True`) with stdout/stderr in a log file, so closing the TUI
never kills a run. The run it creates is found in the registry by the child's pid.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prime_lab.runs.paths import child_python, lab_home
from prime_lab.runs.registry import Run, RunRegistry

CLI_BOOTSTRAP = "import sys; from prime_lab.workbench.cli import main; sys.argv[0] = 'prime'; main()"
FIRST_USE_SECONDS = {"smollm2-135m": 20}  # building a preset on first use (SmolLM2: its GGUF dequantised, 15-30 s)


class LaunchError(Exception):
    """A launch that could not start (shown to the user as a message, never a traceback)."""


@dataclass(frozen=True)
class EvalRequest:
    """What `prime eval run` needs: the environment, the model and how many rollouts."""

    env_id: str
    model: str | None = None
    num_examples: int = 5
    rollouts_per_example: int = 3
    base_url: str | None = None
    env_args_json: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)

    def argv(self) -> list[str]:
        args = ["eval", "run", self.env_id, "-n", str(self.num_examples), "-r", str(self.rollouts_per_example)]
        if self.model:
            args += ["-m", self.model]
        if self.base_url:
            args += ["-b", self.base_url]
        if self.env_args_json:
            args += ["-a", self.env_args_json]
        return args + list(self.extra)


@dataclass(frozen=True)
class Launched:
    """A started CLI process: its pid, its log file and the command line it runs."""

    pid: int
    log_path: Path
    argv: list[str]
    process: subprocess.Popen[bytes]

    def exit_code(self) -> int | None:
        return self.process.poll()


def config_argv(kind: str, path: Path) -> list[str]:
    """The CLI command that launches a config file of this kind."""
    at = f"@{path}"
    if kind in ("rl", "sft"):
        return [kind, "run", at, "--yes"]
    if kind == "gepa":
        return ["gepa", "run", at]
    return ["eval", "run", at]


def first_use_note(model: object, *, served_locally: bool = True) -> str | None:
    """What to say while a launched command builds its model preset before the run exists (the preset is not on
    this machine yet: SmolLM2 is converted from its GGUF on first use); None when there is nothing to wait for."""
    from prime_lab.models import PRESETS, Availability
    from prime_lab.models.presets import DEFAULT_MODEL

    name = model if isinstance(model, str) and model else DEFAULT_MODEL
    preset = PRESETS.get(name)
    if not served_locally or preset is None or preset.availability() is not Availability.BUILDABLE:
        return None
    seconds = FIRST_USE_SECONDS.get(name)
    return f"Preparing {name} (first use on this machine{f': ~{seconds} s' if seconds else ''}) before the run starts"


def launch(argv: list[str], *, cwd: Path | None = None, log_dir: Path | None = None) -> Launched:
    """Start `prime ARGV` detached, its output in a log file. Returns at once."""
    logs = log_dir or lab_home() / "launches"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}.log"
    command = [*child_python(), "-c", CLI_BOOTSTRAP, *argv]
    with open(log_path, "ab") as log:
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=cwd, start_new_session=True, env=os.environ.copy())
        except OSError as exc:
            raise LaunchError(f"could not start `prime {' '.join(argv)}`: {exc}") from exc
    return Launched(process.pid, log_path, argv, process)


def run_to_end(argv: list[str], *, cwd: Path | None = None) -> tuple[int, str]:
    """Start `prime ARGV` as `launch` does and wait for it to exit (blocks: call in a worker): its exit code and what
    it said last (its `Error:` line, else its last lines). `prime env install ID` from the editor goes this way."""
    launched = launch(argv, cwd=cwd)
    code = launched.process.wait()
    try:
        lines = launched.log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    errors = [line for line in lines if line.startswith("Error:")]
    return code, errors[-1] if errors else _tail(launched.log_path)


def wait_for_run(launched: Launched, registry: RunRegistry, *, timeout: float = 120.0,
                 poll: float = 0.1, on_line: Callable[[str], None] | None = None) -> Run:
    """The run the launched process registered (its pid is one of the run's processes). Blocks: call in a worker.

    `prime rl run` (and `prime sft run`) builds a model preset met for the first time before it creates the run
    (15-30 s for SmolLM2, longer on a busy machine), hence the long timeout, and downloads a Hugging Face model that
    is not on this machine, printing a line every few seconds: the wait ends `timeout` seconds after the command's
    last output, and each line it writes goes to `on_line`. A command that exits is reported at once.
    """
    deadline = time.monotonic() + timeout
    read = 0
    while time.monotonic() < deadline:
        for run in registry.runs():
            processes = run.read_status().get("processes") or {}
            if any(isinstance(p, dict) and p.get("pid") == launched.pid for p in processes.values()):
                return run
        code = launched.exit_code()
        if code is not None:
            tail = _tail(launched.log_path)
            raise LaunchError(f"`prime {' '.join(launched.argv)}` exited ({code}) before creating a run"
                              + (f": {tail}" if tail else ""))
        lines, read = _new_lines(launched.log_path, read)
        if lines:
            deadline = time.monotonic() + timeout
            for line in lines:
                if on_line is not None:
                    on_line(line)
        time.sleep(poll)
    raise LaunchError(f"`prime {' '.join(launched.argv)}` created no run within {timeout:g} s "
                      f"(its output: {launched.log_path})")


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines written to `path` after byte `offset`, and the offset after them."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(text[-lines:])
