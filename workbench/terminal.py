"""Drive the installed `prime lab` in a real terminal (tmux): start it, wait for text, send keys, read the pane.

Used by the tmux smoke test and by bench/lab_startup.py; nothing here imports textual.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path


class TmuxPane:
    """One detached tmux session on a private server socket, running one command."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                 width: int = 100, height: int = 30) -> None:
        if shutil.which("tmux") is None:
            raise RuntimeError("tmux is not installed (Debian: apt-get install tmux)")
        self.socket = f"prime-lab-{uuid.uuid4().hex[:8]}"
        self.name = "lab"
        command = " ".join(_quote(a) for a in argv)
        self._tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), "-c", str(cwd),
                   command, env=env)

    def _tmux(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30,
                             env={**os.environ, **(env or {})})
        return out.stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", self.name],
                              capture_output=True, timeout=30).returncode == 0

    def wait_for(self, *needles: str, timeout: float = 30.0, interval: float = 0.01) -> float:
        """Seconds until every needle is on screen; raises TimeoutError with the screen otherwise."""
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            screen = self.text()
            if all(n in screen for n in needles):
                return time.perf_counter() - start
            time.sleep(interval)
        raise TimeoutError(f"{needles} not on screen after {timeout} s:\n{self.text()}")

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
