"""The installed `prime` console script as a user runs it, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

PRIME = str(Path(sys.executable).parent / "prime")


def prime(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
          timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`prime ARGS` from `cwd`, in `env` (None: this test's environment, os.environ, as monkeypatch left it), with
    `input` on its stdin (a pipe), killed after `timeout` seconds; no traceback ever reaches its user."""
    proc = subprocess.run([PRIME, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=os.environ if env is None else env, input=input)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc
