"""Where prime-lab keeps things on disk.

`PRIME_LAB_HOME` (default `~/.prime-lab`) holds `runs/` and `models/`. `PRIME_LAB_MODELS` moves the models folder
on its own (tests share one materialised model folder across a session while each test gets an empty home).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def lab_home() -> Path:
    return Path(os.environ.get("PRIME_LAB_HOME") or Path.home() / ".prime-lab").expanduser()


def runs_dir() -> Path:
    return lab_home() / "runs"


def models_dir() -> Path:
    override = os.environ.get("PRIME_LAB_MODELS")
    return Path(override).expanduser() if override else lab_home() / "models"


def child_python() -> list[str]:
    """The interpreter command for prime-lab's child processes (`-m`/`-c` after it).

    `-P`: the current folder is not put first on `sys.path`, so a project folder holding `lab/`, `environments/`
    or a module named like a dependency shadows nothing in the servers, the trainer or the orchestrator.
    """
    return [sys.executable, "-P"]
