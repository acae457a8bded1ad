"""The installed `prime` console script as a user runs it, for the CLI tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

PRIME = str(Path(sys.executable).parent / "prime")
# Python's own start-up report of a .pth file in .venv that a test installing an environment beside prime-lab (on
# another xdist worker) has half written or half removed at that moment: pip writes an editable install's .pth and
# its finder module one after the other. The interpreter goes on; it is not prime-lab's output.
_SITE_PTH_REPORT = re.compile(r"Error processing line \d+ of \S+\.pth:\n.*?Remainder of file ignored\n", re.S)


def without_site_reports(stderr: str) -> str:
    """`stderr` without the interpreter's reports of a .pth file caught mid-install by another test."""
    return _SITE_PTH_REPORT.sub("", stderr)


def prime(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
          timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`prime ARGS` from `cwd`, in `env` (None: this test's environment, os.environ, as monkeypatch left it), with
    `input` on its stdin (a pipe), killed after `timeout` seconds; no traceback ever reaches its user."""
    proc = subprocess.run([PRIME, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=os.environ if env is None else env, input=input)
    proc.stderr = without_site_reports(proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc
