"""Run directories, run ids, status, and the run registry (list, stop, delete).

A run is a directory `$PRIME_LAB_HOME/runs/<run-id>/` (layout in DESIGN.md). `status.json` is replaced atomically
(write a temp file, then rename) under a lock, so readers never see half a status and concurrent writers never lose
each other's fields. States: queued -> starting -> running -> completed | failed | stopped. A run whose processes
are all gone while its status still says it is active, or whose supervisor (`launcher`) is gone, shows as `failed` (and
is recorded so).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.events import EventLog, EventWriter
from prime_lab.runs.paths import runs_dir

State = Literal["queued", "starting", "running", "completed", "failed", "stopped"]
STATES: tuple[str, ...] = ("queued", "starting", "running", "completed", "failed", "stopped")
ACTIVE_STATES = frozenset({"queued", "starting", "running"})
FINAL_STATES = frozenset({"completed", "failed", "stopped"})
KINDS = ("rl", "sft", "gepa", "eval")
# The process that owns a run, by kind: the RL supervisor, or the `prime eval run` / `prime gepa run` command. When
# it is gone while the run is active, the run has failed, whatever else of it is still running.
OWNER_ROLES = ("launcher", "eval", "gepa")
# Registered processes never signalled when a run's leftovers are ended: the foreground `prime rl run` / `restart`
# command is the user's own terminal process (it sees the run fail and exits by itself).
SPARED_ROLES = frozenset({"cli"})
_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: ids are read and typed by people


class RunError(Exception):
    """A user-facing problem with a run (not found, ambiguous, refused); the message says what to do."""


def new_run_id(kind: str) -> str:
    return f"{kind}-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(6))


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (guards against a recycled pid); None where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime); the command name in field 2 may contain spaces, so split after its ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def pid_alive(pid: int, start_time: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # a zombie has finished; only its parent has not reaped it yet
            return False
    except OSError:
        pass
    return start_time is None or process_start_time(pid) in (None, start_time)


@dataclass(frozen=True)
class StopResult:
    run_id: str
    state: str
    signalled: bool
    killed: bool
    message: str


class Run:
    """One run directory."""

    def __init__(self, path: Path) -> None:
        self.dir = Path(path)
        self.id = self.dir.name

    # Layout -------------------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.dir / "config.toml"

    @property
    def resolved_path(self) -> Path:
        return self.dir / "resolved.json"

    @property
    def status_path(self) -> Path:
        return self.dir / "status.json"

    @property
    def events_path(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def rollouts_dir(self) -> Path:
        return self.dir / "rollouts"

    @property
    def checkpoints_dir(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def adapters_dir(self) -> Path:
        return self.dir / "adapters"

    @property
    def model_dir(self) -> Path:
        """A completed SFT run's model: a Hugging Face folder (LoRA merged) that RL, eval and GEPA load."""
        return self.dir / "model"

    @property
    def gepa_dir(self) -> Path:
        return self.dir / "gepa"

    def log_path(self, process: str) -> Path:
        return self.logs_dir / f"{process}.log"

    # Status -------------------------------------------------------------------------------------------------
    def read_status(self) -> dict[str, Any]:
        try:
            data = json.loads(self.status_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    @contextlib.contextmanager
    def _status_lock(self) -> Iterator[None]:
        fd = os.open(self.dir / ".status.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def update_status(self, **changes: Any) -> dict[str, Any]:
        """Merge `changes` into status.json atomically; returns the new status."""
        with self._status_lock():
            status = self.read_status()
            status.update(changes)
            status["updated_at"] = time.time()
            write_json_atomic(self.status_path, status)
        return status

    def set_state(self, state: State, *, source: str = "launcher", reason: str | None = None, **extra: Any) -> None:
        """Record a state change in status.json and as a `status` event."""
        changes: dict[str, Any] = {"state": state, **extra}
        if reason is not None:
            changes["reason"] = reason
        if state in FINAL_STATES:
            changes["ended_at"] = time.time()
        if state == "running" and "started_at" not in self.read_status():
            changes["started_at"] = time.time()
        self.update_status(**changes)
        with self.writer(source) as writer:
            writer.emit("status", {"state": state, **({"reason": reason} if reason else {})})

    def register_process(self, role: str, pid: int, *, pgid: int | None = None) -> None:
        with self._status_lock():
            status = self.read_status()
            found = status.get("processes")
            processes: dict[str, Any] = found if isinstance(found, dict) else {}
            processes[role] = {"pid": pid, "start_time": process_start_time(pid)}
            status["processes"] = processes
            if pgid is not None:
                status["pgid"] = pgid
            status["updated_at"] = time.time()
            write_json_atomic(self.status_path, status)

    def live_processes(self, status: dict[str, Any] | None = None) -> dict[str, int]:
        status = self.read_status() if status is None else status
        processes = status.get("processes")
        live: dict[str, int] = {}
        if isinstance(processes, dict):
            for role, info in processes.items():
                if isinstance(info, dict) and isinstance(info.get("pid"), int) \
                        and pid_alive(info["pid"], info.get("start_time")):
                    live[role] = info["pid"]
        return live

    def status(self) -> dict[str, Any]:
        """The status, with a dead active run turned into `failed` (and recorded, so it stays failed)."""
        status = self.read_status()
        state = status.get("state")
        live = self.live_processes(status) if state in ACTIVE_STATES and status.get("processes") else None
        owners = [role for role in OWNER_ROLES if role in (status.get("processes") or {})]
        if live is not None and (not live or (owners and not any(role in live for role in owners))):
            reason = "its processes exited without a final status (killed or crashed)"
            if status.get("kind") in ("rl", "sft"):
                reason += f"; resume it from its latest checkpoint: prime {status['kind']} restart {self.id}"
            if live:
                self.end_processes()  # what the dead owner left running (a sampler in its own group)
            self.set_state("failed", reason=reason)
            status = self.read_status()
        return status

    def registered_processes(self, status: dict[str, Any] | None = None) -> list[tuple[str, int, str | None]]:
        """(role, pid, start time) of every process registered in the status."""
        processes = (self.read_status() if status is None else status).get("processes")
        out = []
        if isinstance(processes, dict):
            for role, info in processes.items():
                if isinstance(info, dict) and isinstance(info.get("pid"), int):
                    out.append((str(role), info["pid"], info.get("start_time")))
        return out

    def end_processes(self, grace: float = 5.0) -> list[int]:
        """SIGKILL the run's process group and every registered process (and the group each leads: a sampler runs
        in its own, with vLLM's engine core beside it), but the spared roles and this process; wait up to `grace` s.
        Returns the pids still alive (none, normally). The reaper calls it when a supervisor dies, `status()` when a
        dead owner left processes behind, `prime rl restart` before it starts a new supervisor."""
        status = self.read_status()
        targets = [(pid, start) for role, pid, start in self.registered_processes(status)
                   if role not in SPARED_ROLES and pid != os.getpid()] + self.sandbox_processes()
        pgid = status.get("pgid")
        if isinstance(pgid, int) and pgid > 1 and pgid != os.getpgrp():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid, start in targets:
            _kill_with_group(pid, start)
        deadline = time.monotonic() + grace
        while True:
            alive = [pid for pid, start in targets if pid_alive(pid, start)]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.05)

    def sandbox_processes(self) -> list[tuple[int, str | None]]:
        """(pid, start time) of each command and job running in the run's sandboxes: sandbox/local.py writes each
        sandbox's folder to `sandboxes/<id>` here and each running command's pid (its process group's leader) to
        `<folder>/procs/<pid>`, holding its start time (runs/ cannot import sandbox/, a floor above it)."""
        found: list[tuple[int, str | None]] = []
        with contextlib.suppress(OSError):
            for record in (self.dir / "sandboxes").iterdir():
                with contextlib.suppress(OSError):
                    for proc in (Path(record.read_text().strip()) / "procs").iterdir():
                        if proc.name.isdigit():
                            with contextlib.suppress(OSError):
                                found.append((int(proc.name), proc.read_text().strip() or None))
        return found

    @property
    def state(self) -> str:
        return str(self.status().get("state", "unknown"))

    # Events -------------------------------------------------------------------------------------------------
    def writer(self, source: str) -> EventWriter:
        """A writer for `source`, stamping the run's current attempt (status `attempt`, 1 until a restart)."""
        return EventWriter(self.events_path, source, attempt=self.attempt)

    @property
    def attempt(self) -> int:
        value = self.read_status().get("attempt")
        return value if isinstance(value, int) and value >= 1 else 1

    def event_log(self) -> EventLog:
        return EventLog(self.events_path)


def _kill_with_group(pid: int, start_time: str | None) -> None:
    """SIGKILL the process group `pid` leads, if it leads one, else `pid` alone (only the same live process)."""
    if not pid_alive(pid, start_time):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


class RunStopped(Exception):
    """SIGTERM reached a process that works a run in-process (`prime ... stop`, the workbench's stop key)."""


def _raise_stopped(signum: int, frame: Any) -> None:
    raise RunStopped()


def exception_line(exc: BaseException) -> str:
    """An exception on one line, for a run's reason and a command's error: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@contextlib.contextmanager
def working(run: Run, source: str) -> Iterator[contextlib.ExitStack]:
    """This process works `run` (an evaluation, a GEPA search): it is registered as the run's `source` process
    and the run is `starting`; SIGTERM raises RunStopped in it. A stop (RunStopped) or Ctrl-C leaves the run
    `stopped` and goes on up; the yielded stack's callbacks (stopping the samplers the work started) run on the way
    out, after SIGTERM's previous handler is back. The caller says `running`, `completed` and `failed` itself; any
    other exception, one the caller did not expect, is written with its traceback to the run's log
    (`logs/<source>.log`) and leaves the run `failed` for its `exception_line` (unless the caller marked it ended
    already, with its own reason) on its way up."""
    run.register_process(source, os.getpid(), pgid=os.getpgid(0))
    run.set_state("starting", source=source)
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    cleanup = contextlib.ExitStack()
    try:
        yield cleanup
    except RunStopped:
        run.set_state("stopped", source=source, reason="stopped by the user")
        raise
    except KeyboardInterrupt:
        run.set_state("stopped", source=source, reason="interrupted")
        raise
    except Exception as exc:
        with contextlib.suppress(OSError):
            run.logs_dir.mkdir(parents=True, exist_ok=True)
            with open(run.log_path(source), "a") as log:
                log.write(f"{time.strftime('%H:%M:%S')} {source} failed: {exception_line(exc)}\n"
                          f"{traceback.format_exc()}")
        if run.read_status().get("state") not in FINAL_STATES:
            run.set_state("failed", source=source, reason=exception_line(exc))
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        cleanup.close()


class RunRegistry:
    """Every run under a runs folder (default `$PRIME_LAB_HOME/runs`)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else runs_dir()

    def create(
        self,
        kind: str,
        *,
        config_text: str,
        resolved: dict[str, Any],
        name: str | None = None,
        model: str | None = None,
        envs: list[str] | None = None,
        max_steps: int | None = None,
        run_id: str | None = None,
    ) -> Run:
        """Make a run directory holding the submitted config, the resolved config and a `queued` status."""
        if kind not in KINDS:
            raise ValueError(f"unknown run kind {kind!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            candidate = run_id or new_run_id(kind)
            try:
                (self.root / candidate).mkdir()
                break
            except FileExistsError:
                if run_id:
                    raise RunError(f"a run named {run_id} already exists") from None
        else:  # pragma: no cover - 32^6 ids
            raise RunError("could not allocate a run id")
        run = Run(self.root / candidate)
        for sub in ("logs", "rollouts", "checkpoints", "adapters"):
            (run.dir / sub).mkdir()
        run.config_path.write_text(config_text)
        write_json_atomic(run.resolved_path, resolved)
        now = time.time()
        run.update_status(id=run.id, kind=kind, state="queued", name=name or run.id, model=model, envs=envs or [],
                          step=0, max_steps=max_steps, created_at=now)
        with run.writer("launcher") as writer:
            writer.emit("status", {"state": "queued"})
        return run

    def runs(self) -> list[Run]:
        """All runs, newest first."""
        if not self.root.is_dir():
            return []
        runs = [Run(p) for p in self.root.iterdir() if p.is_dir() and (p / "status.json").exists()]
        return sorted(runs, key=lambda r: r.read_status().get("created_at", 0.0), reverse=True)

    def get(self, run_id: str) -> Run:
        """The run with this id, or the only run whose id starts with it."""
        exact = self.root / run_id
        if run_id and "/" not in run_id and (exact / "status.json").exists():
            return Run(exact)
        matches = [r for r in self.runs() if r.id.startswith(run_id)] if run_id else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RunError(f"'{run_id}' matches {len(matches)} runs ({', '.join(r.id for r in matches[:5])}): "
                           "give more of the id")
        raise RunError(f"no run '{run_id}' in {self.root}: `prime rl list` shows the runs")

    def stop(self, run_id: str, *, grace: float = 30.0) -> StopResult:
        """Graceful stop: SIGTERM to the run's process group, wait `grace` s, then SIGKILL. Idempotent."""
        run = self.get(run_id)
        status = run.status()
        state = str(status.get("state"))
        if state not in ACTIVE_STATES:
            return StopResult(run.id, state, False, False, f"{run.id} is already {state}")
        live = run.live_processes(status)
        signalled = _signal_run(status, live, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while run.live_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = False
        if run.live_processes():
            killed = _signal_run(run.read_status(), run.live_processes(), signal.SIGKILL)
            end = time.monotonic() + 5.0
            while run.live_processes() and time.monotonic() < end:
                time.sleep(0.05)
        final = run.read_status().get("state")
        if final in ACTIVE_STATES:
            reason = "stopped by the user" + (f" (killed after {grace:g} s without exiting)" if killed else "")
            run.set_state("stopped", reason=reason)
            final = "stopped"
        message = f"{run.id} {final}" + (" (its processes did not exit in time and were killed)" if killed else "")
        return StopResult(run.id, str(final), signalled, killed, message)

    def delete(self, run_id: str, *, force: bool = False) -> Run:
        """Remove a run directory; an active run needs `force` (it is stopped first)."""
        run = self.get(run_id)
        if run.state in ACTIVE_STATES:
            if not force:
                raise RunError(f"{run.id} is {run.state}: stop it first (`prime rl stop {run.id}`) or delete "
                               "with -f/--force")
            self.stop(run.id, grace=5.0)
        shutil.rmtree(run.dir)
        return run


def _signal_run(status: dict[str, Any], live: dict[str, int], sig: signal.Signals) -> bool:
    """Signal the run's process group (or, without one, each live process). True if anything was signalled."""
    sent = False
    pgid = status.get("pgid")
    if isinstance(pgid, int) and pgid > 1 and live:
        try:
            os.killpg(pgid, sig)
            sent = True
        except (ProcessLookupError, PermissionError):
            pass
    for pid in live.values():
        try:
            os.kill(pid, sig)
            sent = True
        except (ProcessLookupError, PermissionError):
            pass
    return sent
