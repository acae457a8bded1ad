"""The installed `prime` console script as a user runs it, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PRIME = str(Path(sys.executable).parent / "prime")


def prime(*args: str, cwd: Path | None = None, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """`prime ARGS` in this test's environment; no traceback ever reaches its user."""
    proc = subprocess.run([PRIME, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=os.environ)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc
