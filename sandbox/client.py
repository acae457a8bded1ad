"""prime_sandboxes' clients, local: `SandboxClient` and `AsyncSandboxClient` with prime-sandboxes 0.5.1's method
names and signatures, over the sandboxes of `local.py`, answering with prime_sandboxes' own models (`Sandbox`,
`CommandResponse`, `BackgroundJob`, ...) and raising its own exceptions (`CommandTimeoutError` past a command's
timeout, `SandboxOOMError` when one runs out of memory, `SandboxNotRunningError` for a sandbox that is gone,
`SandboxFileNotFoundError`), so that an environment written for Prime's hosted sandboxes runs unmodified (shim.py
puts these in prime_sandboxes' place).

A request is read leniently: `start_command` as a string (prime-sandboxes 0.2, and verifiers' SandboxEnv to this
day) or a `StartCommand` (0.5), a `CreateSandboxRequest` or a plain dict. A start command other than a keep-alive
(`tail -f /dev/null`, `sleep infinity`) is the sandbox's `start_command`: it starts the process tree the sandbox
holds until deleted, and later commands run in its namespaces (what it left running is there for them, as in a
container of the service).
What the machine's `[sandbox]` settings decide (settings.py) wins over the request: the network is closed unless
`[sandbox] network = true` (a request's `network_allowlist` does not open it; that is said once), `memory_gb` when
set, the isolation; a command without a timeout gets `[sandbox] timeout` (default 300 s, as prime_sandboxes').

This module imports no prime-lab module (only this folder's, relatively) and prime_sandboxes only inside its
functions: in a release environment's own interpreter, shim.py loads this folder under another package name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, NoReturn

from . import local, stats
from .settings import Settings, from_environ

DEFAULT_IMAGE = "python:3.11-slim"  # verifiers' SandboxEnv default
MOUNT_PATH = "/app"
KEEP_ALIVE = re.compile(r"\s*(tail\s+-f\s+/dev/null|sleep\s+(infinity|inf|\d+))\s*")
SHELLS = ("sh", "/bin/sh", "bash", "/bin/bash")
JOB_POLL_S = (0.02, 1.0)  # a local job's status is a file: polled from the first value, doubling up to the second

Names = list[str]  # ids or labels (the clients' own `list` method hides the builtin in their bodies)

_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def say_once(message: str, run_dir: str | None = None, key: str | None = None) -> None:
    """A line for the user, once per process and run (`key`: what makes two messages one; default the message): a
    notice in the run's sandbox stats (stats.py: `prime eval run` prints it, an RL run shows it as an alert; the
    process may be an environment server, whose log nobody reads), or on stderr outside a run."""
    key = key or message
    with _said_lock:
        if (run_dir or "", key) in _said:
            return
        _said.add((run_dir or "", key))
    if run_dir and os.path.isdir(run_dir):
        local._count(run_dir, {"time": time.time(), "event": "notice", "key": key, "message": message})
    else:
        print(f"prime-lab sandbox: {message}", file=sys.stderr, flush=True)


# prime_sandboxes' own classes, imported when first needed -------------------------------------------------------

def _ps() -> Any:
    import prime_sandboxes

    return prime_sandboxes


def _error(name: str, *args: Any, text: str, **kwargs: Any) -> Exception:
    """prime_sandboxes' exception `name` made with these arguments (a release without it, or whose class takes
    others: APIError or that class with `text` alone)."""
    ps = _ps()
    cls = getattr(ps, name, None)
    try:
        if cls is not None:
            error: Exception = cls(*args, **kwargs)
            return error
    except TypeError:
        pass
    fallback = getattr(ps, "APIError", RuntimeError)
    return fallback(text) if cls is None else cls(text)


def _gone(sandbox_id: str, exc: BaseException, command: str | None = None) -> Exception:
    """The exception for a sandbox that is deleted, expired or unknown (SandboxTimeoutError for one past its
    `timeout_minutes`)."""
    text = str(exc)
    expired = "lifetime" in text or "expired" in text
    kind, error_type = ("SandboxTimeoutError", "TIMEOUT") if expired else ("SandboxNotRunningError",
                                                                           "SANDBOX_NOT_FOUND")
    message = f"Sandbox {sandbox_id} is not running: {text}" + (f" (command: {command})" if command else "")
    return _error(kind, sandbox_id, "TERMINATED", error_type, command=command, message=message, text=message)


def _model(name: str, data: dict[str, Any]) -> Any:
    return getattr(_ps(), name).model_validate(data)


# requests ------------------------------------------------------------------------------------------------------

def start_command_text(command: Any) -> str | None:
    """A start command in either form (a string; a StartCommand or its dict) as the shell line it runs."""
    if command is None or isinstance(command, str):
        return command or None
    if isinstance(command, dict):
        executable, args = command.get("executable"), list(command.get("args") or [])
    else:
        executable, args = getattr(command, "executable", None), list(getattr(command, "args", None) or [])
    if not executable:
        return None
    if executable in SHELLS and len(args) == 2 and args[0] == "-c":
        return str(args[1])
    return shlex.join([str(executable), *map(str, args)])


def lenient_request(base: type) -> type:
    """`CreateSandboxRequest` (`base`) that also takes `start_command` as a string, made the StartCommand that runs it
    (`sh -c LINE`): verifiers' SandboxEnv passes "tail -f /dev/null", which prime-sandboxes 0.5 refuses."""
    from pydantic import field_validator

    fields = getattr(base, "model_fields", {})
    if "start_command" not in fields:  # a release that still takes the string
        return base

    def command(cls: type, value: Any) -> Any:
        if isinstance(value, str):
            return {"executable": "sh", "args": ["-c", value]} if value.strip() else None
        return value

    namespace: dict[str, Any] = {
        "__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__,
        "_start_command_string": field_validator("start_command", mode="before")(classmethod(command))}
    return type(base.__name__, (base,), namespace)


def request_data(request: Any) -> dict[str, Any]:
    """A create request's fields, whatever it came as (a CreateSandboxRequest of any release, a dict)."""
    if isinstance(request, dict):
        return dict(request)
    dump = getattr(request, "model_dump", None)
    if callable(dump):
        data: dict[str, Any] = dump()
        return data
    return {k: v for k, v in vars(request).items() if not k.startswith("_")}


def _float(value: Any, default: float) -> float:
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def spec_for(data: dict[str, Any], settings: Settings) -> local.SandboxSpec:
    """The local sandbox a request asks for, under this machine's `[sandbox]` settings."""
    if (data.get("network_allowlist") or data.get("network_denylist")) and not settings.network:
        say_once("an environment asks for network access (network_allowlist); local sandboxes have none unless "
                 "[sandbox] network = true", settings.run_dir)
    elif data.get("network_allowlist") or data.get("network_denylist"):
        say_once("[sandbox] network = true opens the whole network: a request's network_allowlist and "
                 "network_denylist are not enforced locally", settings.run_dir)
    if int(_float(data.get("gpu_count"), 0)) > 0:
        say_once("an environment asks for a GPU in its sandbox; local sandboxes have none", settings.run_dir)
    env = {**(data.get("environment_vars") or {}), **(data.get("secrets") or {})}
    return local.SandboxSpec(
        name=str(data.get("name") or "sandbox"), image=str(data.get("docker_image") or DEFAULT_IMAGE),
        memory_gb=settings.memory_gb or _float(data.get("memory_gb"), 1.0),
        disk_size_gb=_float(data.get("disk_size_gb"), 5.0), cpu_cores=_float(data.get("cpu_cores"), 1.0),
        timeout_minutes=int(_float(data.get("timeout_minutes"), 60)), network=settings.network,
        env={str(k): str(v) for k, v in env.items()}, labels=dict.fromkeys(map(str, data.get("labels") or []), ""),
        isolation=settings.isolation, run_dir=settings.run_dir, start_command=start_command(data))


def start_command(data: dict[str, Any]) -> str | None:
    """A request's start command as the shell line the sandbox holds, or None where it only keeps a container
    alive (a sandbox without one runs no process while idle)."""
    command = start_command_text(data.get("start_command"))
    return command if command and not KEEP_ALIVE.fullmatch(command) else None


# answers ----------------------------------------------------------------------------------------------------------

def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def sandbox_model(sandbox: local.Sandbox) -> Any:
    """A local sandbox as prime_sandboxes' `Sandbox` (RUNNING: a local sandbox exists until deleted)."""
    spec, created = sandbox.spec, _time(sandbox.created)
    return _model("Sandbox", {
        "id": sandbox.id, "name": spec.name, "dockerImage": spec.image, "cpuCores": spec.cpu_cores,
        "memoryGB": spec.memory_gb, "diskSizeGB": spec.disk_size_gb, "diskMountPath": MOUNT_PATH, "gpuCount": 0,
        "status": "RUNNING", "timeoutMinutes": spec.timeout_minutes, "labels": list(spec.labels),
        "createdAt": created, "updatedAt": created, "startedAt": created})


def timed_out(sandbox_id: str, command: str, timeout: float) -> Exception:
    seconds = int(timeout) if float(timeout).is_integer() else timeout
    return _error("CommandTimeoutError", sandbox_id, command, seconds,
                  text=f"Command '{command}' timed out after {seconds}s in sandbox {sandbox_id}")


NETWORK_FAILURES = re.compile(r"Network is unreachable|Temporary failure in name resolution|Could not resolve host|"
                              r"Name or service not known|Failed to establish a new connection|No route to host")


def network_hint(sandbox: local.Sandbox, result: local.CommandResult) -> None:
    """A command that failed for want of the network, in a sandbox without one: the setting that opens it, once."""
    if result.exit_code != 0 and not sandbox.spec.network and NETWORK_FAILURES.search(result.stderr[-20000:]):
        say_once(f"a command in sandbox {sandbox.id} ({sandbox.spec.name}) could not reach the network: local "
                 "sandboxes have none unless [sandbox] network = true (--sandbox '{\"network\": true}')",
                 sandbox.spec.run_dir, key="network")


def command_response(sandbox: local.Sandbox, command: str, timeout: float, result: local.CommandResult) -> Any:
    """A command's result as prime_sandboxes' `CommandResponse`; past its timeout CommandTimeoutError, out of
    memory SandboxOOMError."""
    if result.timed_out:
        raise timed_out(sandbox.id, command, timeout)
    if result.oom:
        message = (f"Command '{command}' ran out of memory in sandbox {sandbox.id} (its limit: "
                   f"{sandbox.spec.memory_gb:g} GB; [sandbox] memory_gb sets it)")
        raise _error("SandboxOOMError", sandbox.id, "RUNNING", "OOM_KILLED", command=command, message=message,
                     text=message)
    network_hint(sandbox, result)
    return _model("CommandResponse", {"stdout": result.stdout, "stderr": result.stderr,
                                      "exit_code": result.exit_code})


def job_model(sandbox_id: str, job: local.Job) -> Any:
    return _model("BackgroundJob", {"job_id": job.job_id, "sandbox_id": sandbox_id, "stdout_log_file": job.stdout_file,
                                    "stderr_log_file": job.stderr_file, "exit_file": job.exit_file})


def local_job(job: Any) -> local.Job:
    """prime_sandboxes' BackgroundJob (or its dict) as the local job it stands for."""
    data = request_data(job)
    return local.Job(job_id=data["job_id"], stdout_file=data["stdout_log_file"], stderr_file=data["stderr_log_file"],
                     exit_file=data["exit_file"])


def job_status(job_id: str, result: local.CommandResult | None) -> Any:
    if result is None:
        return _model("BackgroundJobStatus", {"job_id": job_id, "completed": False})
    return _model("BackgroundJobStatus", {"job_id": job_id, "completed": True, "exit_code": result.exit_code,
                                          "stdout": result.stdout, "stderr": result.stderr})


def poll_delays(poll_interval: float) -> Iterator[float]:
    """The waits between a job's status checks: short at first (a status is a file here), at most poll_interval."""
    delay, most = JOB_POLL_S
    most = min(most, max(poll_interval, delay))
    while True:
        yield delay
        delay = min(delay * 2, most)


def upload_answer(path: str, size: int) -> Any:
    return _model("FileUploadResponse", {"success": True, "path": path, "size": size, "timestamp": _time(time.time())})


def _missing(path: str) -> Exception:
    return _error("SandboxFileNotFoundError", f"File not found: {path}", text=f"File not found: {path}")


def _api_error(message: str) -> Exception:
    return _error("APIError", message, text=message)


def list_answer(sandboxes: list[local.Sandbox], status: str | None, page: int, per_page: int) -> Any:
    chosen = [] if status and status.upper() != "RUNNING" else sorted(sandboxes, key=lambda s: -s.created)
    start = max(page - 1, 0) * per_page
    return _model("SandboxListResponse", {
        "sandboxes": [sandbox_model(s) for s in chosen[start:start + per_page]], "total": len(chosen), "page": page,
        "perPage": per_page, "hasNext": start + per_page < len(chosen)})


def label_filter(labels: list[str] | None) -> dict[str, str] | None:
    return dict.fromkeys(labels, "") if labels else None


# the clients -----------------------------------------------------------------------------------------------------

class _LocalSandboxes:
    """What both clients share: the sandboxes this client made (by id; any other is found by its folder) and the
    settings they were made under."""

    def __init__(self) -> None:
        self._sandboxes: dict[str, local.Sandbox] = {}

    @property
    def settings(self) -> Settings:
        return from_environ()

    def _sandbox(self, sandbox_id: str, command: str | None = None) -> local.Sandbox:
        known = self._sandboxes.get(sandbox_id)
        if known is not None:
            return known
        try:
            return local.get(sandbox_id)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc, command) from None

    def _create(self, request: Any) -> Any:
        data = request_data(request)
        try:
            sandbox = local.create(spec_for(data, self.settings))
        except local.ImageNotSupported as exc:
            name = str(data.get("name") or "sandbox")
            raise _error("SandboxImagePullError", name, "ERROR", "IMAGE_PULL_FAILED", message=str(exc),
                         text=str(exc)) from None
        except local.SandboxError as exc:
            raise _api_error(str(exc)) from None
        self._sandboxes[sandbox.id] = sandbox
        return sandbox_model(sandbox)

    def _wait(self, sandbox_id: str) -> None:
        self._sandbox(sandbox_id)

    def _bulk_wait(self, sandbox_ids: list[str]) -> dict[str, str]:
        failed = []
        for sandbox_id in sandbox_ids:
            try:
                self._sandbox(sandbox_id)
            except Exception:  # noqa: BLE001 - gone: named as prime_sandboxes names it
                failed.append((sandbox_id, "TERMINATED"))
        if failed:
            raise RuntimeError(f"Sandboxes failed: {failed}")
        return dict.fromkeys(sandbox_ids, "RUNNING")

    def _list(self, status: str | None, labels: list[str] | None, page: int, per_page: int) -> Any:
        return list_answer(local.list_sandboxes(label_filter(labels)), status, page, per_page)

    def _delete(self, sandbox_id: str) -> dict[str, Any]:
        self._sandboxes.pop(sandbox_id, None)
        try:
            sandbox = local.get(sandbox_id)
        except local.SandboxGone as exc:
            raise _api_error(f"HTTP 404: sandbox {sandbox_id} not found ({exc})") from None
        sandbox.delete()
        return {"success": True, "message": f"Sandbox {sandbox_id} deleted"}

    def _bulk_delete(self, sandbox_ids: list[str] | None, labels: list[str] | None) -> Any:
        if not sandbox_ids and not labels:
            raise _api_error("bulk_delete needs sandbox_ids or labels")
        ids = list(sandbox_ids or [])
        if labels:
            ids += [s.id for s in local.list_sandboxes(label_filter(labels)) if s.id not in ids]
        succeeded: list[str] = []
        failed: list[dict[str, str]] = []
        for sandbox_id in ids:
            try:
                self._delete(sandbox_id)
                succeeded.append(sandbox_id)
            except Exception as exc:  # noqa: BLE001 - each failure is reported, the others still deleted
                failed.append({"sandbox_id": sandbox_id, "error": str(exc)})
        return _model("BulkDeleteSandboxResponse", {"succeeded": succeeded, "failed": failed,
                                                    "message": f"{len(succeeded)} sandboxes deleted"})

    def _logs(self, sandbox_id: str) -> str:
        """Its start command's output so far, then each command run in it with its exit code and the ends of its
        output (stats.command_log)."""
        lines = []
        for entry in stats.command_log(self._sandbox(sandbox_id).folder):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                what = "start command, running" if entry.get("start") else \
                    f"exit {entry['exit_code']}, {entry['seconds']:g} s"
                lines.append(f"$ {entry['command']}  ({what})\n{entry.get('stdout') or ''}{entry.get('stderr') or ''}")
        return "".join(part if part.endswith("\n") else part + "\n" for part in lines)

    def _timeout(self, timeout: float | None) -> float:
        return float(timeout) if timeout is not None and timeout > 0 else self.settings.timeout

    def _start_job(self, sandbox_id: str, command: str, working_dir: str | None, env: dict[str, str] | None) -> Any:
        sandbox = self._sandbox(sandbox_id, command)
        try:
            return job_model(sandbox_id, sandbox.start_job(command, working_dir=working_dir, env=env))
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc, command) from None

    def _job(self, sandbox_id: str, job: Any) -> Any:
        handle = local_job(job)
        try:
            sandbox = self._sandbox(sandbox_id)
            result = sandbox.job_status(handle)
            if result is not None:
                network_hint(sandbox, result)
            return job_status(handle.job_id, result)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc) from None
        except local.SandboxError as exc:
            raise _api_error(str(exc)) from None

    def _write(self, sandbox_id: str, file_path: str, data: bytes) -> Any:
        try:
            self._sandbox(sandbox_id).write_file(file_path, data)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc) from None
        except (OSError, ValueError, local.SandboxError) as exc:
            raise _api_error(f"Upload failed: {file_path}: {exc}") from None
        return upload_answer(file_path, len(data))

    def _read(self, sandbox_id: str, file_path: str, offset: int | None = None, length: int | None = None) -> bytes:
        try:
            return self._sandbox(sandbox_id).read_file(file_path, offset or 0, length)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc) from None
        except FileNotFoundError:
            raise _missing(file_path) from None
        except (OSError, ValueError, local.SandboxError) as exc:
            raise _api_error(f"Read file failed: {file_path}: {exc}") from None

    def _download(self, sandbox_id: str, file_path: str, local_file_path: str) -> None:
        data = self._read(sandbox_id, file_path)
        folder = os.path.dirname(local_file_path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(local_file_path, "wb") as handle:
            handle.write(data)

    def _read_answer(self, sandbox_id: str, file_path: str, offset: int | None, length: int | None) -> Any:
        data = self._read(sandbox_id, file_path, offset, length)
        windowed = offset is not None or length is not None
        return _model("ReadFileResponse", {"content": data.decode("utf-8", errors="replace"), "size": len(data),
                                           **({"offset": offset or 0} if windowed else {})})

    def _unsupported(self, name: str) -> NoReturn:
        raise NotImplementedError(f"prime-lab's local sandboxes have no {name}(); [sandbox] provider = \"prime\" "
                                  "uses Prime's hosted service")


def _local_file(path: str) -> bytes:
    if not os.path.exists(path):
        raise FileNotFoundError(f"Local file not found: {path}")
    with open(path, "rb") as handle:
        return handle.read()


class SandboxClient(_LocalSandboxes):
    """prime_sandboxes.SandboxClient, local. `SandboxClient(APIClient())` as environments build it: the API client
    is kept (as `client`) and never called."""

    def __init__(self, api_client: Any = None, **_: Any) -> None:
        super().__init__()
        self.client = api_client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self._unsupported(name)

    def create(self, request: Any) -> Any:
        return self._create(request)

    def wait_for_creation(self, sandbox_id: str, max_attempts: int = 60, stability_checks: int = 1,
                          image_build_timeout_seconds: int = 3000) -> None:
        self._wait(sandbox_id)

    def bulk_wait_for_creation(self, sandbox_ids: list[str], max_attempts: int = 60,
                               image_build_timeout_seconds: int = 3000) -> dict[str, str]:
        return self._bulk_wait(sandbox_ids)

    def get(self, sandbox_id: str) -> Any:
        return sandbox_model(self._sandbox(sandbox_id))

    def list(self, team_id: str | None = None, status: str | None = None, labels: list[str] | None = None,
             page: int = 1, per_page: int = 50, exclude_terminated: bool | None = None,
             user_id: str | None = None) -> Any:
        return self._list(status, labels, page, per_page)

    def delete(self, sandbox_id: str) -> dict[str, Any]:
        return self._delete(sandbox_id)

    def bulk_delete(self, sandbox_ids: Names | None = None, labels: Names | None = None,
                    team_id: str | None = None, user_id: str | None = None, all_users: bool = False) -> Any:
        return self._bulk_delete(sandbox_ids, labels)

    def get_logs(self, sandbox_id: str) -> str:
        return self._logs(sandbox_id)

    def execute_command(self, sandbox_id: str, command: str, working_dir: str | None = None,
                        env: dict[str, str] | None = None, timeout: int | None = None,
                        user: str | None = None) -> Any:
        sandbox, seconds = self._sandbox(sandbox_id, command), self._timeout(timeout)
        try:
            result = sandbox.execute(command, timeout=seconds, working_dir=working_dir, env=env)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc, command) from None
        return command_response(sandbox, command, seconds, result)

    def start_background_job(self, sandbox_id: str, command: str, working_dir: str | None = None,
                             env: dict[str, str] | None = None, user: str | None = None) -> Any:
        return self._start_job(sandbox_id, command, working_dir, env)

    def get_background_job(self, sandbox_id: str, job: Any, timeout: int | None = None) -> Any:
        return self._job(sandbox_id, job)

    def run_background_job(self, sandbox_id: str, command: str, timeout: int = 900, working_dir: str | None = None,
                           env: dict[str, str] | None = None, poll_interval: int = 3) -> Any:
        job = self.start_background_job(sandbox_id, command, working_dir=working_dir, env=env)
        deadline = time.monotonic() + timeout
        for delay in poll_delays(poll_interval):
            status = self.get_background_job(sandbox_id, job)
            if status.completed:
                return status
            if time.monotonic() >= deadline:
                break
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        raise timed_out(sandbox_id, command, timeout)

    def upload_file(self, sandbox_id: str, file_path: str, local_file_path: str, timeout: int | None = None) -> Any:
        return self._write(sandbox_id, file_path, _local_file(local_file_path))

    def upload_bytes(self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str,
                     timeout: int | None = None) -> Any:
        return self._write(sandbox_id, file_path, file_bytes)

    def download_file(self, sandbox_id: str, file_path: str, local_file_path: str, timeout: int | None = None) -> None:
        self._download(sandbox_id, file_path, local_file_path)

    def read_file(self, sandbox_id: str, file_path: str, timeout: int | None = None, offset: int | None = None,
                  length: int | None = None) -> Any:
        return self._read_answer(sandbox_id, file_path, offset, length)

    def clear_auth_cache(self) -> None:
        """Nothing to clear: a local sandbox needs no token."""


class AsyncSandboxClient(_LocalSandboxes):
    """prime_sandboxes.AsyncSandboxClient, local; `async with` or `await aclose()` as Prime's (nothing to close).
    Commands run as asyncio subprocesses of whichever event loop calls (verifiers' threaded client runs one per
    thread); cancelling one kills its processes. What blocks (creating, deleting, files) runs in a thread."""

    def __init__(self, api_key: str | None = None, max_connections: int = 1000, max_keepalive_connections: int = 200,
                 **_: Any) -> None:
        super().__init__()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self._unsupported(name)

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to close: no connection is held (the sandboxes live until deleted, as Prime's do)."""

    async def create(self, request: Any) -> Any:
        return await asyncio.to_thread(self._create, request)

    async def wait_for_creation(self, sandbox_id: str, max_attempts: int = 60, stability_checks: int = 1,
                                image_build_timeout_seconds: int = 3000) -> None:
        self._wait(sandbox_id)

    async def bulk_wait_for_creation(self, sandbox_ids: list[str], max_attempts: int = 60,
                                     image_build_timeout_seconds: int = 3000) -> dict[str, str]:
        return self._bulk_wait(sandbox_ids)

    async def get(self, sandbox_id: str) -> Any:
        return sandbox_model(self._sandbox(sandbox_id))

    async def list(self, team_id: str | None = None, status: str | None = None, labels: list[str] | None = None,
                   page: int = 1, per_page: int = 50, exclude_terminated: bool | None = None,
                   user_id: str | None = None) -> Any:
        return self._list(status, labels, page, per_page)

    async def delete(self, sandbox_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._delete, sandbox_id)

    async def bulk_delete(self, sandbox_ids: Names | None = None, labels: Names | None = None,
                          team_id: str | None = None, user_id: str | None = None, all_users: bool = False) -> Any:
        return await asyncio.to_thread(self._bulk_delete, sandbox_ids, labels)

    async def get_logs(self, sandbox_id: str) -> str:
        return self._logs(sandbox_id)

    async def execute_command(self, sandbox_id: str, command: str, working_dir: str | None = None,
                              env: dict[str, str] | None = None, timeout: int | None = None,
                              user: str | None = None) -> Any:
        sandbox, seconds = self._sandbox(sandbox_id, command), self._timeout(timeout)
        try:
            result = await sandbox.aexecute(command, timeout=seconds, working_dir=working_dir, env=env)
        except local.SandboxGone as exc:
            raise _gone(sandbox_id, exc, command) from None
        return command_response(sandbox, command, seconds, result)

    async def start_background_job(self, sandbox_id: str, command: str, working_dir: str | None = None,
                                   env: dict[str, str] | None = None, user: str | None = None) -> Any:
        return await asyncio.to_thread(self._start_job, sandbox_id, command, working_dir, env)

    async def get_background_job(self, sandbox_id: str, job: Any, timeout: int | None = None) -> Any:
        return self._job(sandbox_id, job)

    async def run_background_job(self, sandbox_id: str, command: str, timeout: int = 900,
                                 working_dir: str | None = None, env: dict[str, str] | None = None,
                                 poll_interval: int = 3) -> Any:
        job = await self.start_background_job(sandbox_id, command, working_dir=working_dir, env=env)
        deadline = time.monotonic() + timeout
        for delay in poll_delays(poll_interval):
            status = await self.get_background_job(sandbox_id, job)
            if status.completed:
                return status
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        raise timed_out(sandbox_id, command, timeout)

    async def upload_file(self, sandbox_id: str, file_path: str, local_file_path: str,
                          timeout: int | None = None) -> Any:
        return await asyncio.to_thread(lambda: self._write(sandbox_id, file_path, _local_file(local_file_path)))

    async def upload_bytes(self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str,
                           timeout: int | None = None) -> Any:
        return await asyncio.to_thread(self._write, sandbox_id, file_path, file_bytes)

    async def download_file(self, sandbox_id: str, file_path: str, local_file_path: str,
                            timeout: int | None = None) -> None:
        await asyncio.to_thread(self._download, sandbox_id, file_path, local_file_path)

    async def read_file(self, sandbox_id: str, file_path: str, timeout: int | None = None, offset: int | None = None,
                        length: int | None = None) -> Any:
        return self._read_answer(sandbox_id, file_path, offset, length)

    async def clear_auth_cache(self) -> None:
        """Nothing to clear: a local sandbox needs no token."""
