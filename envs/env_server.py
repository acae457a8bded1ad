"""prime-lab's side of an isolated environment: its server process and the client that drives it.

The server is `driver.py serve` in the environment's own interpreter (verifiers' own ZMQEnvServer where the release
has one, our driver otherwise); this side speaks verifiers' environment-server protocol to it: ZMQ (a DEALER socket
to the server's ROUTER), msgpack payloads, `run_group` requests, `b"ping"` for health, an empty payload to cancel a
request (`[request_id, b""]`). One socket per event loop (evaluation runs each batch in `asyncio.run`, GEPA in a loop
of its own), so the client follows whichever loop calls.

Like the samplers (`ServerProcess`), the server leads its own process group, gets SIGKILL when the thread that
started it ends, and ends its own group when its parent dies (driver.py); a run registers it with its reaper. A
server that dies fails the requests waiting on it (`EnvServerDied`, with its log's last lines); one that stops
answering (a rollout that blocks its event loop, a deadlock, a SIGSTOP) is found by pinging it while a request waits:
WATCHDOG_MISSES pings in a row left unanswered, each given WATCHDOG_INTERVAL_S, and it is killed, which fails them the
same way; an answered ping starts the count again, so a server that is alive and slow is never killed. A request its
caller stops waiting for (a rollout past its time limit, a cancelled task) is cancelled on the server too, as
verifiers' own client does, so its rollouts and their model requests stop there (every release but 0.1.10, whose
server has no cancel: `takes_cancel`). Restarting it is the environment's (isolated.py).

verifiers 0.3.1's server loads the environment again in each env worker, a process it starts with multiprocessing's
spawn, and starts a worker that dies again every few seconds, forever, while the server answers pings: a worker that
cannot load its environment would hold each request until its caller's time limit (300 s a rollout). While a request
waits, the worker logs are read (`WorkerWatch`): a worker whose latest start died with a traceback before it loaded
fails the request at once with `EnvironmentCannotLoad`, naming the worker's error and its log.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from prime_lab.runs.processes import ServerProcess, free_port, log_tail

DRIVER = Path(__file__).with_name("driver.py")
PING = b"ping"
HEALTH_REQUEST = msgspec.msgpack.encode({"request_type": "health"})
LOG_LINES = 15
POLL_S = 0.5  # how often a waiting request checks that its server's process lives
WATCHDOG_INTERVAL_S = 10.0  # while a request waits, its server is pinged this often; each ping has this long to answer
WATCHDOG_MISSES = 3  # pings in a row left unanswered: the server is hung, and killed


class EnvServerError(RuntimeError):
    """The environment's server is gone or refused a request; the message names the environment and what its log
    says."""


class EnvironmentDown(RuntimeError):
    """An environment's server died more often than it may be restarted (isolated.MAX_RESTARTS): what waits on it
    fails, and the run, evaluation or GEPA run with it. The message names the environment, the restarts tried and
    its log's last lines."""

    def line(self) -> str:
        """The message on one line, for a command's error and its run's reason: its first line, with the last of
        the log's lines it quotes (the rest, a traceback of the server's, stays in the log it names)."""
        head, *quoted = str(self).strip().splitlines() or [""]
        last = next((line.strip() for line in reversed(quoted) if line.strip()), "")
        if not last:
            return head
        return f"{head[:-1]} end with: {last[:300]}" if head.endswith(":") else f"{head} ({last[:300]})"


class EnvironmentCannotLoad(EnvironmentDown):
    """The environment loaded in its interpreter's `describe` but not in verifiers' env worker: starting it again
    cannot help, so what waits on it fails, and the run, evaluation or GEPA run with it. One line."""


class EnvServerDied(EnvServerError):
    """The server's process is gone (it exited, was killed, or was killed here for not answering) while a request
    waited on it: the request may be sent again to a server started anew."""


def driver_command(python: Path | str, *args: str) -> list[str]:
    """The driver run by path in another interpreter, isolated (-I) from our PYTHONPATH and from this folder."""
    return [str(python), "-I", str(DRIVER), *args]


def run_driver(python: Path | str, command: str, module: str, *args: str, env: Mapping[str, str] | None = None,
               timeout: float = 600) -> dict[str, Any]:
    """One `check` or `describe` in the environment's interpreter; its JSON answer (or {'error': ...})."""
    with tempfile.TemporaryDirectory(prefix="prime-lab-driver-") as folder:
        out = Path(folder) / "out.json"
        argv = driver_command(python, command, module, *args, str(out))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(env or {}) or None,
                                  check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"the driver did not answer within {timeout:g} s"}
        except OSError as exc:  # its interpreter is gone (the release's environment was deleted)
            return {"error": f"cannot run {python}: {exc.strerror or exc}", "missing_interpreter": True}
        try:
            answer = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-LOG_LINES:])
            return {"error": f"the driver exited with code {done.returncode}:\n{tail}"}
    return answer if isinstance(answer, dict) else {"error": f"unexpected answer {answer!r}"}


def health_check(release: str) -> bytes:
    """What a server of `release` takes as a health check: b"ping" (0.1.12 on, and prime-lab's driver, which serves
    releases before 0.1.10), a health request for 0.1.10's and 0.1.11's own servers, which answer b"ping" with an
    error and a traceback in their log (0.1.11 with a warning line for the health request, which it leaves to a
    process of its own)."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(release)
    except InvalidVersion:
        return PING
    return HEALTH_REQUEST if Version("0.1.10") <= version < Version("0.1.12") else PING


def takes_cancel(release: str) -> bool:
    """Whether a server of `release` takes verifiers' cancel (`[request_id, b""]`) and cancels that request's task:
    prime-lab's driver (releases before 0.1.10) and verifiers' own servers from 0.1.11; 0.1.10's reads every payload
    as a request (an empty one is an error and a traceback in its log)."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(release)
    except InvalidVersion:
        return True
    return not Version("0.1.10") <= version < Version("0.1.11")


def ping(address: str, timeout: float = 1.0, payload: bytes = PING) -> bool:
    """Whether a server answers a health check at `address` within `timeout` seconds (any answer: an error still
    says it is up)."""
    import zmq

    context: Any = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send_multipart([uuid.uuid4().hex.encode(), payload])
        return bool(socket.poll(int(timeout * 1000)))
    finally:
        socket.close()


class EnvServerProcess(ServerProcess):
    """`driver.py serve` for one environment, at tcp://127.0.0.1:PORT."""

    def __init__(self, python: Path | str, module: str, args: Mapping[str, Any], *, name: str, log_path: Path,
                 env: Mapping[str, str], health: bytes = PING, cancels: bool = True) -> None:
        port = free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        log_dir = log_path.parent / f"{log_path.stem}.d"
        log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(driver_command(python, "serve", module, json.dumps(dict(args)), self.address, str(log_dir)),
                         port=port, log_path=log_path, env=env, name=name)
        self.log_dir = log_dir
        self.workers = WorkerWatch(log_path, log_dir)  # verifiers' env workers, read while a request waits
        self.health = health  # its health check (`health_check`)
        self.cancels = cancels  # it takes verifiers' cancel (`takes_cancel`)
        self.killed_because: str | None = None  # set when this side killed it (hung)

    def gone(self, code: int) -> str:
        """Why it is gone, in one line."""
        return self.killed_because or f"its server exited (code {code})"

    def kill(self, reason: str) -> None:
        """End its whole process group now (SIGKILL: a hung server does not run its SIGTERM handler)."""
        self.killed_because = reason
        self.stop(grace=0)

    def is_healthy(self, timeout: float = 2.0) -> bool:
        return ping(self.address, timeout, self.health)

    def start(self) -> EnvServerProcess:
        self.workers = WorkerWatch(self.log_path, self.log_dir)  # from the logs' ends: a restarted server appends
        super().start()
        return self

    def tail(self) -> str:
        """The last lines of its log and of the logs verifiers' server writes beside it."""
        parts = [log_tail(self.log_path, LOG_LINES)]
        parts += [log_tail(p, LOG_LINES) for p in sorted(self.log_dir.glob("*.log"))]
        return "\n".join(p for p in parts if p)


class EnvServerClient:
    """Requests to one environment server; responses matched to requests by id. While requests wait, the server is
    pinged (one ping at a time, whoever waits sends it), its answer matched the same way."""

    def __init__(self, server: EnvServerProcess) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._socket: Any = None
        self._pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self._receiver: asyncio.Task[None] | None = None
        # the ping waiting for its answer: its id, when it was sent, and its own future (`_receive` takes answered
        # ones out of `_pending`: the watchdog reads the answer here)
        self._ping: tuple[bytes, float, asyncio.Future[dict[str, Any]]] | None = None
        self._misses = 0  # pings in a row left unanswered
        self._next_ping = 0.0

    def _bind(self) -> Any:
        import zmq
        import zmq.asyncio

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.close()
            self._loop = loop
            self._socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.connect(self.server.address)
            self._receiver = loop.create_task(self._receive())
        return self._socket

    async def _receive(self) -> None:
        while True:
            request_id, payload = (await self._socket.recv_multipart())[-2:]
            future = self._pending.pop(request_id, None)
            if future is not None and not future.done():
                try:
                    future.set_result(msgspec.msgpack.decode(payload))
                except msgspec.DecodeError as exc:
                    future.set_exception(exc)

    async def request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request; wait for its response. Raises EnvServerDied if the server dies meanwhile, or stops
        answering pings (WATCHDOG_MISSES in a row, each given WATCHDOG_INTERVAL_S): then it is killed first. Cancelled
        (a time limit, a cancelled task), it sends the server verifiers' cancel for the request."""
        socket = self._bind()
        request_id = uuid.uuid4().hex.encode()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await socket.send_multipart([request_id, msgspec.msgpack.encode(payload)])
            while True:
                await asyncio.wait({future}, timeout=POLL_S)
                if future.cancelled():  # closed under it: its server was stopped (restarted by another request)
                    raise EnvServerDied("its server was stopped while this request waited")
                if future.done():
                    return future.result()
                code = self.server.poll()
                if code is not None:
                    raise EnvServerDied(self._died(code))
                failure = self.server.workers.failure()
                if failure is not None:
                    raise EnvironmentCannotLoad(f"{self.server.name} cannot load in verifiers' env worker (a "
                                                f"process of its own, which verifiers starts again every few "
                                                f"seconds): {failure}")
                await self._watch(socket)
        except asyncio.CancelledError:
            if not future.done():
                self._cancel(socket, request_id)
            raise
        finally:
            self._pending.pop(request_id, None)

    def _cancel(self, socket: Any, request_id: bytes) -> None:
        """verifiers' cancel for `request_id` (`[request_id, b""]`), sent without waiting: a cancelled caller must
        not wait on a server that may be gone, and a server that has no cancel (`takes_cancel`) gets none."""
        import zmq

        if not self.server.cancels or socket is not self._socket or socket.closed:
            return
        try:
            sent = socket.send_multipart([request_id, b""], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        sent.add_done_callback(lambda done: done.cancelled() or done.exception())  # its error, if any, retrieved

    async def _watch(self, socket: Any) -> None:
        """Judge the last ping (answered, or not within WATCHDOG_INTERVAL_S: a miss) and send the next when due;
        after WATCHDOG_MISSES misses in a row the server is hung: killed, with EnvServerDied. An answered ping
        starts the count again."""
        now = time.monotonic()
        if self._ping is not None:
            ping_id, sent, answer = self._ping
            answered = answer.done() and not answer.cancelled()
            if not answered and now - sent < WATCHDOG_INTERVAL_S:
                return
            self._pending.pop(ping_id, None)
            self._ping = None
            if answered:
                answer.exception()  # an undecodable answer is an answer too; retrieved, so asyncio does not warn
            else:
                answer.cancel()
            self._misses = 0 if answered else self._misses + 1
            if self._misses >= WATCHDOG_MISSES:
                self.server.kill(f"its server answered none of {self._misses} pings in "
                                 f"{self._misses * WATCHDOG_INTERVAL_S:g} s (hung) and was killed")
                raise EnvServerDied(self._died(self.server.poll()))
        if self._ping is None and now >= self._next_ping:
            ping_id = uuid.uuid4().hex.encode()
            answer = asyncio.get_running_loop().create_future()
            self._pending[ping_id] = answer
            self._ping, self._next_ping = (ping_id, now, answer), now + WATCHDOG_INTERVAL_S
            await socket.send_multipart([ping_id, self.server.health])

    def _died(self, code: int | None) -> str:
        return (f"{self.server.gone(code if code is not None else -9)}; last lines of its log "
                f"({self.server.log_path}):\n{self.server.tail()}")

    def close(self) -> None:
        if self._receiver is not None and self._loop is not None and not self._loop.is_closed():
            self._receiver.cancel()
        if self._socket is not None:
            self._socket.close()
        self._socket = self._receiver = self._loop = self._ping = None
        self._misses = 0
        for future in self._pending.values():
            if not future.done() and not future.get_loop().is_closed():
                future.cancel()
        self._pending.clear()


WORKER_HEADER = re.compile(r"^Process (?:.*-)?(\d+):$")  # multiprocessing's, before a process's traceback
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d|driver: |prime-lab )")  # a line no traceback holds
NOT_EXCEPTION = ("Traceback (most recent call last):", "The above exception", "During handling of the above")
WORKER_LOG = re.compile(r"^env_worker_(\d+)\.log$")  # verifiers 0.3.1's, one per worker, in the server's log folder
WORKER_LOADING = "Loading environment"  # verifiers' load_environment, at each start of a worker
WORKER_LOADED = "Initialized worker"  # verifiers' env worker, once its environment loaded


class WorkerWatch:
    """What verifiers' env workers (0.3.1) wrote since their server started, read a little at each `failure()`:
    each worker's starts (`Loading environment` in its own log, env_worker_N.log) and whether the latest loaded
    (`Initialized worker`), and the tracebacks of worker processes that died (multiprocessing's `Process NAME-N:`
    header and traceback, in the server's own log). Every worker start writes one Loading line and every death by
    an exception one traceback: a worker with as many tracebacks as starts, whose latest start did not load, cannot
    load its environment (verifiers would start it again forever)."""

    def __init__(self, server_log: Path, log_dir: Path) -> None:
        self.server_log, self.log_dir = server_log, log_dir
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        for path in (server_log, *log_dir.glob("env_worker_*.log")):
            try:
                self.offsets[path] = path.stat().st_size
            except OSError:
                pass
        self.starts: dict[int, int] = {}
        self.loaded: dict[int, bool] = {}
        self.deaths: dict[int, int] = {}
        self.errors: dict[int, str] = {}  # each worker's last traceback's last exception line
        self.block: int | None = None  # the worker whose traceback the server log is in
        self.block_grew = False  # that traceback got lines at this read (it may not be whole yet)

    def _new_lines(self, path: Path) -> list[str]:
        """The whole lines appended to `path` since the last read."""
        offset = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offsets[path] = offset + len(chunk)
        data = self.partial.pop(path, b"") + chunk
        whole, _, rest = data.rpartition(b"\n")
        if rest:
            self.partial[path] = rest
        return whole.decode("utf-8", "replace").splitlines() if whole else []

    def _read(self) -> None:
        for path in self.log_dir.glob("env_worker_*.log"):
            match = WORKER_LOG.match(path.name)
            if match is None:
                continue
            worker = int(match.group(1))
            for line in self._new_lines(path):
                if WORKER_LOADING in line:
                    self.starts[worker] = self.starts.get(worker, 0) + 1
                    self.loaded[worker] = False
                elif WORKER_LOADED in line:
                    self.loaded[worker] = True
        self.block_grew = False
        for line in self._new_lines(self.server_log):
            header = WORKER_HEADER.match(line)
            if header is not None:
                self.block = int(header.group(1))
                self.deaths[self.block] = self.deaths.get(self.block, 0) + 1
                self.block_grew = True
            elif self.block is not None and LOG_LINE.match(line):
                self.block = None
            elif self.block is not None:
                self.block_grew = True
                if line.strip() and not line[0].isspace() and not line.startswith(NOT_EXCEPTION):
                    self.errors[self.block] = line.strip()

    def failure(self) -> str | None:
        """The first worker that cannot load its environment, as "its error (its log: PATH)", or None."""
        self._read()
        for worker, deaths in sorted(self.deaths.items()):
            if worker == self.block and self.block_grew:
                continue  # its traceback is still being written: its last line is read next time
            if deaths >= max(1, self.starts.get(worker, 0)) and not self.loaded.get(worker, False):
                error = self.errors.get(worker, "it died before its environment loaded")
                return (f"{error[:500]} (its log: {self.log_dir / f'env_worker_{worker}.log'}; the traceback in "
                        f"{self.server_log})")
        return None


def group_request(inputs: Sequence[Mapping[str, Any]], base_url: str, key_var: str, model: str,
                  sampling_args: Mapping[str, Any]) -> dict[str, Any]:
    """verifiers' `run_group` request: the server builds its own OpenAI client from `client_config`."""
    return {"request_type": "run_group", "group_inputs": [dict(i) for i in inputs],
            "client_config": {"api_base_url": base_url, "api_key_var": key_var}, "model": model,
            "sampling_args": dict(sampling_args), "max_retries": 0, "state_columns": ["trajectory"]}
