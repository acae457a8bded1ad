"""A fork server for verifiers v1's harness program: the program's imports done once, each rollout's run forked.

verifiers 0.4's `null` harness runs a PEP 723 chat program per rollout (`python chat.py ARGS` in the environment uv
prepared for it); its imports (openai, mcp, httpx) take ~1.5 s of a core on every start, more than the rollout's
own work on a small model. driver_v1.py's runtime starts this file once per program, with the program's own
interpreter (`INTERPRETER -I forkserver_v1.py SOCKET SCRIPT`): it runs the script's top-level imports, then listens
on the Unix socket. Each connection is one run: a JSON line (`argv`: the script's arguments, `env`, `cwd`) with the
run's stdout and stderr descriptors beside it (SCM_RIGHTS). The server forks; the child starts its own session
(process group: the runtime kills the whole tree as it kills a subprocess's), takes the descriptors as fd 1 and 2
(stdin /dev/null), the environment, folder and arguments, and runs the script as `__main__` (runpy), as `python
SCRIPT ARGS` would; the server answers the child's pid, then its exit status, and closes the connection. Only the
standard library: it runs in the program's interpreter, where prime-lab is not installed.

The server is single-threaded (forking from it is safe) and ends when its parent (the driver) is gone or its socket
is closed.
"""

from __future__ import annotations

import array
import ast
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

MAX_HEADER = 1 << 20


def warm(script: str) -> None:
    """Run the script's top-level imports (what `python SCRIPT` would import first), each on its own: one that
    fails here fails again in the run, where the program reports it."""
    with open(script, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), script)
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            with contextlib.suppress(Exception):
                exec(compile(ast.Module(body=[node], type_ignores=[]), script, "exec"), {})  # noqa: S102


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        chunk, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(2 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if not chunk or len(data) > MAX_HEADER:
            raise ConnectionError("the run's request ended early")
        data += chunk
    return json.loads(data), list(fds)


def child(script: str, request: dict, fds: list[int], listener: socket.socket, conn: socket.socket) -> None:
    """In the forked child: become `python SCRIPT ARGS` in the request's session, folder and environment."""
    code = 1
    try:
        listener.close()
        conn.close()
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            if fd > 2:
                os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.chdir(request.get("cwd") or os.getcwd())
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
        sys.argv = [script, *[str(a) for a in request.get("argv") or []]]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int | None):
                print(done.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
            traceback.print_exc()
            code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(path: str, script: str) -> None:
    sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` puts the script's folder first
    warm(script)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for _key, _events in selector.select(timeout=0.02):
            conn, _ = listener.accept()
            try:
                request, fds = receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                child(script, request, fds, listener, conn)
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(f"pid {pid}\n".encode())
            running[pid] = conn
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in running:
                conn = running.pop(pid)
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
    for pid in running:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
