"""A model server running as its own process: start it, wait until `/health` answers, stop it cleanly.

Both engines (the built-in server and vLLM) run through `ServerProcess`. The server gets its own process
group, so `stop()` ends it together with any workers it forked, and it gets SIGKILL when the process that started
it dies (Linux's parent-death signal: a `prime eval run` or `prime gepa run` killed with -9 leaves no sampler behind;
an RL run's reaper also ends the sampler's whole group). Start servers from a main thread: the signal fires when the
starting thread ends. Its stdout and stderr go to a log file; when
it fails to come up, the error carries the tail of that log, which is where the reason is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from prime_lab.runs.reaper import die_with_parent

LOG_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """The server process exited, or did not answer `/health` in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def answers_health(root_url: str, timeout: float = 2.0) -> bool:
    """Whether the server at `root_url` (no `/v1`) answers `GET /health` with 200 within `timeout` seconds."""
    try:
        with urllib.request.urlopen(f"{root_url.rstrip('/')}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ServerProcess:
    """One server process serving an OpenAI-compatible API on 127.0.0.1:`port`."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        name: str = "server",
        host: str = "127.0.0.1",
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.name = name
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (what `openai.OpenAI(base_url=...)` takes)."""
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> ServerProcess:
        if self._process is not None:
            raise RuntimeError(f"{self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env} if self.env is not None else None
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        return self

    def poll(self) -> int | None:
        """The exit code, or None while it runs (or before it starts)."""
        return self._process.poll() if self._process is not None else None

    def is_healthy(self, timeout: float = 2.0) -> bool:
        return answers_health(self.root_url, timeout)

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.25) -> None:
        """Block until `GET /health` answers 200; raise ServerStartError if it exits or `timeout` passes."""
        if self._process is None:
            raise RuntimeError(f"{self.name} was not started")
        deadline = time.monotonic() + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"exited with code {code} before it was ready"))
            if self.is_healthy():
                return
            if time.monotonic() >= deadline:
                self.stop()
                what = f"did not answer {self.root_url}/health within {timeout:g} s"
                raise ServerStartError(self._failure(what))
            time.sleep(interval)

    def _failure(self, what: str) -> str:
        tail = log_tail(self.log_path)
        message = f"{self.name} ({' '.join(self.argv[:4])} ...) {what}. Log: {self.log_path}"
        return f"{message}\n--- last lines of the log ---\n{tail}" if tail else message

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL. Safe to call twice."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                process.wait(timeout=10)
        # Workers the server forked may outlive it; the group is its own, so finish them off.
        self._signal_group(signal.SIGKILL)
        return process.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._process is not None
        try:
            os.killpg(self._process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> ServerProcess:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass
class RunningServer:
    """A started OpenAI-compatible server: where it answers and what it serves. Engines' handles extend it."""

    process: ServerProcess
    model_path: Path
    model_name: str

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def root_url(self) -> str:
        return self.process.root_url

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def stop(self) -> int | None:
        return self.process.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
