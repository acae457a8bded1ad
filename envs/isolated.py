"""Environments installed at their own verifiers release, in that release's virtual environment (releases.py).

`prime env install` records each such environment here (`$PRIME_LAB_HOME/environments/isolated.json`: its id, module,
release, interpreter and why that release was chosen), and the loader gives an `IsolatedEnvironment` for its id: the
same protocol as an environment in this process (`GroupEnvironment`), its rows, system prompt and rubric described
by its own interpreter (`driver.py describe`), its rollouts run by a server in that interpreter (env_server.py),
started at the first rollout and ended with this process (or by the run's reaper). What reaches that interpreter:
our environment (with a run's `env_file` values), the environment's own secrets, and the model's key in a variable
of its own; the model is reached at our sampler's URL.

A server that dies (or hangs, and is killed: env_server.py) is started again at the next request, after a back-off,
at most MAX_RESTARTS times per environment; each restart is announced (`serve_into`'s `on_restart`, a WARNING line),
and the groups it was serving are sent once more to the new one. Past the bound, `run_group` raises EnvironmentDown
with the server's last log lines: the run, evaluation or GEPA run fails, naming the environment, rather than go on
without it. So does an environment that verifiers' env worker cannot load (`EnvironmentCannotLoad`, env_server.py),
at once: no restart loads it.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prime_lab.envs import hub
from prime_lab.envs.arguments import EnvironmentLoadError
from prime_lab.envs.env_server import (
    EnvironmentCannotLoad,
    EnvironmentDown,
    EnvServerClient,
    EnvServerDied,
    EnvServerError,
    EnvServerProcess,
    group_request,
    health_check,
    ping,
    run_driver,
    takes_cancel,
)
from prime_lab.envs.environment import Environment, Rollout, SamplingArgs
from prime_lab.envs.installed import canonical, module_name
from prime_lab.envs.parsers import Messages, Parser
from prime_lab.envs.rubric import Rubric
from prime_lab.envs.verifiers_adapter import GroupEnvironment, failed_rollout, request_args, to_input, to_rollout
from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.paths import lab_home

logger = logging.getLogger(__name__)

KEY_VARIABLE = "PRIME_LAB_MODEL_API_KEY"  # the model's key, in the server's environment (verifiers' api_key_var)
READY_TIMEOUT_S = 180.0  # loading an environment (its dataset) can take a while
MAX_RESTARTS = 3  # a server that dies is started again this many times per environment; its next death is the end
RESTART_BACKOFF_S = (1.0, 2.0, 4.0)  # the wait before the first, second, third restart
KEEP_LOGS = 20  # server logs kept outside runs (the newest)


@dataclass(frozen=True)
class IsolatedRecord:
    """One environment installed at its own release."""

    name: str  # what a user types (canonical)
    module: str
    distribution: str
    version: str
    release: str  # the verifiers release it runs on
    python: str  # that release's interpreter
    target: str  # what was installed (a folder or a file)
    reason: str  # why this release, in words
    summary: str = ""  # the module docstring's first paragraph
    args: tuple[tuple[str, Any, bool, str], ...] = ()  # load_environment's (name, default, required, annotation)
    any_args: bool = False  # it takes **kwargs: any other argument goes through to it


def registry_path() -> Path:
    return lab_home() / "environments" / "isolated.json"


def records() -> dict[str, IsolatedRecord]:
    try:
        data = json.loads(registry_path().read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for name, entry in (data.get("environments") or {}).items():
        try:
            out[name] = IsolatedRecord(**{**entry, "args": tuple(tuple(a) for a in entry.get("args") or ())})
        except TypeError:
            continue
    return out


@contextmanager
def records_locked() -> Iterator[None]:
    """The records file's lock (`isolated.json.lock` beside it, exclusive): a read-modify-write under it loses no
    other process's record."""
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _write_records(found: Mapping[str, IsolatedRecord]) -> None:
    write_json_atomic(registry_path(), {"environments": {k: asdict(v) for k, v in sorted(found.items())}})


def save_record(record: IsolatedRecord) -> None:
    with records_locked():
        found = records()
        found[record.name] = record
        _write_records(found)


def remove_record(name: str) -> None:
    """Forget the isolated environment `name`, or every one the distribution `name` provides."""
    with records_locked():
        found = records()
        kept = {k: v for k, v in found.items() if canonical(name) not in (k, canonical(v.distribution))}
        if len(kept) != len(found):
            _write_records(kept)


def record_for(env_id: str) -> IsolatedRecord | None:
    """The isolated environment an id names (`owner/my-env`, `my_env`), if one is installed."""
    return records().get(canonical(module_name(env_id)))


# Where servers log, and who is told when one starts (a run registers it with its reaper) -----------------------

_servers: list[EnvServerProcess] = []
_names: dict[str, int] = {}  # servers named so far in this process, by environment name
_lock = threading.Lock()
_context: dict[str, Any] = {"log_dir": None, "on_start": None, "on_restart": None}


def serve_into(log_dir: Path, on_start: Callable[[str, int], None] | None = None,
               on_restart: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Servers started from now on log into `log_dir` (`env-<name>.log`) and are announced to `on_start(role,
    pid)`: a run's orchestrator registers them, so its reaper ends them with the run (a restarted server too).
    Each restart is told to `on_restart` with {"env", "role", "restarts", "max_restarts", "exit_code", "reason",
    "log_tail"} (`role`: the server's, `env-<name>`, one per environment in this process: two environments of one
    id, as two `[[env]]` entries, are told apart by it)."""
    _context.update(log_dir=Path(log_dir), on_start=on_start, on_restart=on_restart)


def serve_for(run: Any, on_restart: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Servers started from now on are `run`'s (a `registry.Run`): logged in its logs folder, registered with it, so
    that its reaper and `stop` end them with it; restarts are told to `on_restart`."""
    serve_into(run.dir / "logs", lambda role, pid: run.register_process(role, pid), on_restart)


def _log_path(name: str) -> Path:
    if _context["log_dir"] is not None:
        return Path(_context["log_dir"]) / f"env-{name}.log"
    folder = lab_home() / "environments" / "logs"
    prune_logs(folder, KEEP_LOGS - 1)  # room for this one
    return folder / f"env-{name}-{os.getpid()}-{int(time.time())}.log"


def prune_logs(folder: Path, keep: int) -> None:
    """Keep the newest `keep` server logs in `folder` (`env-*.log`), with their `<stem>.d` folders; remove the rest."""
    def modified(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # removed meanwhile (another process pruning)
            return 0.0

    for old in sorted(folder.glob("env-*.log"), key=modified, reverse=True)[keep:]:
        old.unlink(missing_ok=True)
        shutil.rmtree(old.with_name(f"{old.stem}.d"), ignore_errors=True)


@atexit.register
def stop_servers() -> None:
    """End every server this process started (at exit; a kill -9 is the parent-death signal's and the reaper's)."""
    with _lock:
        servers = list(_servers)
        _servers.clear()
    for server in servers:
        server.stop(grace=5)


# The environment ---------------------------------------------------------------------------------------------------

class DescribedParser(Parser):
    """The environment's parser as its interpreter described it: its format, no parsing here."""

    def __init__(self, format_hint: str) -> None:
        self.hint = format_hint

    def parse(self, text: str) -> str | None:
        return None

    def parse_answer(self, completion: Messages | str) -> str | None:
        return None

    def format_hint(self) -> str:
        return self.hint


def described_rubric(rubric: Mapping[str, Any], parser: Parser) -> Rubric:
    """The reward functions' names and weights, for showing (the environment's interpreter does the scoring)."""
    def named(name: str) -> Callable[..., float]:
        def reward(**_: Any) -> float:
            raise RuntimeError(f"{name} runs in the environment's own interpreter")

        reward.__name__ = name
        return reward

    names = [str(n) for n in rubric.get("names") or []]
    weights = rubric.get("weights")
    return Rubric([named(n) for n in names], list(weights) if weights and len(weights) == len(names) else None,
                  parser=parser)


def server_environment(record: IsolatedRecord, env_id: str, api_key: str,
                       extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the environment's interpreter gets: our environment, its own secrets, `extra` (its judge's variables,
    judges.wire), the model's key; the Hub offline when it did not answer the probe, unless the user chose (as in
    this process, hub.forced_offline)."""
    from prime_lab.envs.secret_store import SecretStore

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(SecretStore().values_for([env_id, record.name]))
    env.update(extra or {})
    if hub.forced_offline():
        env.update(dict.fromkeys(hub.OFFLINE_VARIABLES, "1"))
    env[KEY_VARIABLE] = api_key
    return env


class IsolatedEnvironment(GroupEnvironment):
    """An environment in its own interpreter, at its own verifiers release, behind our protocol."""

    def __init__(self, record: IsolatedRecord, env_id: str, args: Mapping[str, Any],
                 environ: Mapping[str, str] | None = None) -> None:
        self.record = record
        self.env_id = env_id
        self.load_args = dict(args)
        self.environ = dict(environ or {})  # added to its interpreter's environment (its judge's, judges.wire)
        described = run_driver(record.python, "describe", record.module, json.dumps(self.load_args),
                               env=server_environment(record, env_id, "EMPTY", self.environ))
        if "error" in described:
            if (offline := hub.driver_failure_message(described, env_id)) is not None:
                raise EnvironmentLoadError(offline)  # the same words and fix as in this process (hub.py)
            where = f" at {described['where']}" if described.get("where") else ""
            raise EnvironmentLoadError(
                f"environment '{env_id}' (isolated, verifiers {record.release}, {record.python}): load_environment("
                f"{', '.join(f'{k}={v!r}' for k, v in self.load_args.items())}) failed in its own interpreter: "
                f"{described['error']}{where}" + ("; install it again: prime env install " + record.target
                                                  if described.get("missing_interpreter") else ""))
        if described.get("message_type", "chat") != "chat":
            raise EnvironmentLoadError(f"environment '{env_id}': message_type={described['message_type']!r} "
                                       "(completion-style prompts) is not supported; prime-lab runs chat environments")
        self.description = described
        self.release = str(described.get("release") or record.release)
        self.system_prompt = described.get("system_prompt")
        self.few_shot = None
        self.sampling_args = dict(described.get("sampling_args") or {})
        limit = described.get("timeout_seconds")  # the environment's own time limit for a rollout, if it sets one
        self.timeout_seconds: float | None = float(limit) if limit is not None else None
        self.parser = DescribedParser(str((described.get("parser") or {}).get("format") or ""))
        self.rubric = described_rubric(described.get("rubric") or {}, self.parser)
        self._reset_rows()
        self._server: EnvServerProcess | None = None
        self._client: EnvServerClient | None = None
        self._key: str | None = None
        self._ready: EnvServerProcess | None = None  # the server that answered a ping
        self._name: str | None = None
        self._start_lock = threading.RLock()
        self._restarts = 0
        self._down: str | None = None  # EnvironmentDown's message, once the bound is passed

    def _split(self, split: str) -> list[dict[str, Any]] | None:
        rows = self.description.get(split)
        return None if rows is None else list(rows)

    def with_system_prompt(self, system_prompt: str | None) -> Environment:
        """Every row's first system message (where verifiers put the environment's own prompt) becomes
        `system_prompt`; the environment is not built again in its interpreter."""
        return self.override_system_prompt(system_prompt)

    # The server --------------------------------------------------------------------------------------------------
    def _start(self, api_key: str) -> tuple[EnvServerProcess, EnvServerClient]:
        """The server (started now, again after it died, or again for a new model key) and its client. Started from
        the calling thread: the parent-death signal is that thread's. Raises EnvironmentDown past MAX_RESTARTS."""
        with self._start_lock:
            self._check_bound()
            server, log_path = self._server, None
            if server is not None:
                code = server.poll()
                if code is not None:
                    self._count_restart(server, code)
                    log_path = server.log_path  # the restarted server's log follows the dead one's
                elif self._client is not None and self._key == api_key:
                    return server, self._client
            self.close()
            name = self._server_name()
            server = EnvServerProcess(self.record.python, self.record.module, self.load_args,
                                      name=f"environment '{self.env_id}' (verifiers {self.release})",
                                      log_path=log_path or _log_path(name),
                                      env=server_environment(self.record, self.env_id, api_key, self.environ),
                                      health=health_check(self.release), cancels=takes_cancel(self.release))
            server.start()
            with _lock:
                _servers.append(server)
            on_start = _context["on_start"]
            if on_start is not None and server.pid is not None:
                on_start(f"env-{name}", server.pid)
            self._server, self._client, self._key = server, EnvServerClient(server), api_key
            return server, self._client

    def _count_restart(self, server: EnvServerProcess, code: int) -> None:
        """`server` died: count the restart to come and announce it."""
        self._restarts += 1
        reason = server.gone(code)
        logger.warning("environment '%s' (verifiers %s): %s; starting it again (restart %d of %d). Its log: %s",
                       self.env_id, self.release, reason, self._restarts, MAX_RESTARTS, server.log_path)
        on_restart = _context["on_restart"]
        if on_restart is not None:
            on_restart({"env": self.env_id, "role": self.server_role, "restarts": self._restarts,
                        "max_restarts": MAX_RESTARTS, "exit_code": code, "reason": reason, "log_tail": server.tail()})

    def _check_bound(self) -> None:
        """Raise EnvironmentDown if the server is dead and was restarted MAX_RESTARTS times already (it is stopped:
        what it forked goes with it)."""
        with self._start_lock:
            server = self._server
            if self._down is None and server is not None and self._restarts >= MAX_RESTARTS:
                code = server.poll()
                if code is None:
                    return
                tried = f"{self._restarts} restart{'' if self._restarts == 1 else 's'} tried"
                self._down = (f"environment '{self.env_id}' (verifiers {self.release}, in its own interpreter) is "
                              f"down: its server died {self._restarts + 1} times ({tried}, the most allowed); the last "
                              f"time {server.gone(code)}. Last lines of its log ({server.log_path}):\n{server.tail()}")
                self.close()
            if self._down is not None:
                raise EnvironmentDown(self._down)

    def _restart_delay(self) -> float:
        """The back-off before the restart the next `_start` makes: 0 while the server lives (or before the first);
        raises EnvironmentDown past the bound."""
        with self._start_lock:
            self._check_bound()
            if self._server is None or self._server.poll() is None:
                return 0.0
            return RESTART_BACKOFF_S[min(self._restarts, len(RESTART_BACKOFF_S) - 1)]

    def _server_name(self) -> str:
        """`vf-fruit-task` for its log and its role in a run; `vf-fruit-task-2` for a second environment of the same
        id in this process (other arguments), so that neither's log or registration takes the other's place."""
        if self._name is None:
            base = canonical(self.env_id.split("/")[-1])
            with _lock:
                _names[base] = _names.get(base, 0) + 1
                self._name = base if _names[base] == 1 else f"{base}-{_names[base]}"
        return str(self._name)

    @property
    def server_role(self) -> str | None:
        """Its server's role in a run (`env-<name>`, `_server_name`), once one was started; else None."""
        return None if self._name is None else f"env-{self._name}"

    async def _ready_client(self, api_key: str) -> EnvServerClient:
        delay = self._restart_delay()
        if delay:
            await asyncio.sleep(delay)
        server, client = self._start(api_key)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._ready is not server:
            code = server.poll()
            if code is not None:
                raise EnvServerDied(f"{server.gone(code)} before it was ready; last lines of its log "
                                    f"({server.log_path}):\n{server.tail()}")
            if time.monotonic() > deadline:
                raise EnvServerError(f"its server did not answer within {READY_TIMEOUT_S:g} s; last lines of its "
                                     f"log ({server.log_path}):\n{server.tail()}")
            if await asyncio.to_thread(ping, server.address, 0.5, server.health):
                self._ready = server
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._server is not None:
            self._server.stop(grace=5)
            with _lock:
                if self._server in _servers:
                    _servers.remove(self._server)
        self._server = self._client = None

    async def run_group(self, client: Any, model: str, rows: Sequence[dict[str, Any]],
                        sampling: SamplingArgs) -> list[Rollout]:
        """The group's rollouts from the environment's server. A group whose server died under it is sent once more,
        to the server started anew; raises EnvironmentDown once the server died more often than it may restart."""
        started = time.perf_counter()
        api_key = str(getattr(client, "api_key", "") or "EMPTY")
        request = group_request([to_input(r) for r in rows], str(client.base_url).rstrip("/"), KEY_VARIABLE, model,
                                request_args(self.sampling_args, sampling))
        try:
            for attempt in (1, 2):
                try:
                    server = await self._ready_client(api_key)
                    response = await server.request(request)
                    break
                except EnvServerDied:
                    self._check_bound()
                    if attempt == 2:
                        raise
                    logger.info("environment '%s': its server died under a group; sending the group again",
                                self.env_id)
            if not response.get("success", False) or response.get("outputs") is None:
                raise EnvServerError(str(response.get("error") or "the server answered without outputs"))
        except EnvironmentCannotLoad as exc:  # a restart loads it no better: down for good, its server stopped
            with self._start_lock:
                self._down = self._down or str(exc)
                self.close()
            raise
        except EnvServerError as exc:
            elapsed = (time.perf_counter() - started) * 1000
            message = f"environment '{self.env_id}' (verifiers {self.release}, in its own interpreter): {exc}"
            return [failed_rollout(r, message, elapsed) for r in rows]
        elapsed = (time.perf_counter() - started) * 1000
        return [to_rollout(o, r, elapsed) for o, r in zip(response["outputs"], rows, strict=True)]
