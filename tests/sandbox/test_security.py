"""What model-written code tries from inside a local sandbox, each refused or contained (issue 44's list).

Each test runs the attempt inside and checks the host: a sandbox that let it through fails the test. Skipped, with
the probe's reason, only where user namespaces are unavailable (then only `isolation = "weak"` runs at all).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.runs.registry import pid_alive
from prime_lab.sandbox import local
from prime_lab.sandbox.local import Sandbox, SandboxSpec

REPO = Path(__file__).resolve().parents[2]
PROBLEM = local.isolation_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"user namespaces unavailable here: {PROBLEM}")


# a sandbox without a start command runs each command in a bwrap of its own; one with a start command holds one bwrap
# for its life and runs each command in it (sandbox/local.py's HOLDER): each attempt is tried against both
KINDS = {"alone": None, "held": "python -c 'import time; time.sleep(600)' held-worker & echo started; wait"}
ALONE = pytest.mark.parametrize("sandbox", ["alone"], indirect=True)  # where the two differ by design


@pytest.fixture(params=list(KINDS))
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    made = local.create(SandboxSpec(memory_gb=0.5, disk_size_gb=0.02, start_command=KINDS[request.param]))
    yield made
    made.delete()


@pytest.fixture
def readable_tmp() -> Iterator[Path]:
    """A folder anyone may read (so that only the sandbox, not file modes, keeps its secrets from the code)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-secrets-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def inside(sandbox: Sandbox, command: str, timeout: float = 20) -> local.CommandResult:
    return sandbox.execute(command, timeout=timeout)


def leftovers(marker: str) -> list[int]:
    """Host pids of the Python processes whose command line holds `marker` (not the shells and bwrap that name it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if argv[0].startswith(b"python") and marker.encode() in argv:
                    found.append(int(entry))
    return found


def appears(marker: str, count: int = 1, within: float = 10.0) -> bool:
    """Whether `count` processes holding `marker` run, waiting up to `within` s for them to start."""
    deadline = time.monotonic() + within
    while len(leftovers(marker)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(leftovers(marker)) == count


def gone(marker: str, within: float = 3.0) -> bool:
    """Whether no process holding `marker` is left, waiting up to `within` s (a namespace ends in a few ms)."""
    deadline = time.monotonic() + within
    while leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return leftovers(marker) == []


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("CONNECTED")
except OSError as error:
    print("refused:", error)
"""


def test_the_hosts_loopback_is_not_reachable(sandbox: Sandbox) -> None:
    """The sampler listens on 127.0.0.1: from inside, 127.0.0.1 is the sandbox's own (empty) loopback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sandbox.write_file("connect.py", CONNECT.encode())
        result = inside(sandbox, f"python connect.py 127.0.0.1 {port}")
        assert "refused" in result.stdout and "CONNECTED" not in result.stdout, result
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()


def test_no_outside_network(sandbox: Sandbox) -> None:
    """Only a loopback interface inside; this machine's own outside address (where the test listens) is unreachable."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = server.getsockname()[1]
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent; the kernel picks the outside interface
            address = probe.getsockname()[0]
        except OSError:
            address = "192.0.2.1"
        finally:
            probe.close()
        sandbox.write_file("connect.py", CONNECT.encode())
        result = inside(sandbox, f"python -c 'import socket; print(socket.if_nameindex())'; "
                                 f"python connect.py {address} {port}; python connect.py 1.1.1.1 443")
        assert result.stdout.splitlines()[0] == "[(1, 'lo')]", result
        assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 2, result
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()


def test_the_hosts_files_are_not_there(sandbox: Sandbox, readable_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~/.ssh, the secret store, a run's folder, the checkout: not in the sandbox, even where file modes allow."""
    home = readable_tmp / "home"
    lab = readable_tmp / "lab"
    secrets = {home / ".ssh" / "id_ed25519": "SSH-KEY-7d1f", lab / "secrets" / "secrets.json": "STORE-KEY-91ac",
               lab / "runs" / "rl-abc123" / "status.json": "RUN-STATUS-44e0"}
    for path, text in secrets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in [path.parent, *path.parent.parents]:
            if folder == readable_tmp:
                break
            folder.chmod(0o755)
        path.chmod(0o644)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PRIME_LAB_HOME", str(lab))
    targets = [*secrets, REPO / "pyproject.toml", Path.home() / ".ssh"]
    listing = "; ".join(f"cat {path}; ls {path.parent}" for path in targets)
    result = inside(sandbox, listing + "; ls -A ~; ls -A /root /home")
    for text in secrets.values():
        assert text not in result.stdout, result
    assert 'name = "prime-lab"' not in result.stdout and "rl-abc123" not in result.stdout, result
    assert result.stdout.strip() == "", result  # not one of those paths exists inside (HOME is the empty /app)


def test_another_sandboxs_app_is_not_there(sandbox: Sandbox) -> None:
    other = local.create(SandboxSpec())
    try:
        other.write_file("secret.txt", b"OTHER-SANDBOX-5c2e")
        host_path = Path(os.path.realpath(other.folder)) / "app" / "secret.txt"
        assert host_path.read_bytes() == b"OTHER-SANDBOX-5c2e"
        result = inside(sandbox, f"cat {host_path}; cat {other.folder}/app/secret.txt; ls /app /tmp /opt/venv")
        assert "OTHER-SANDBOX-5c2e" not in result.stdout, result
    finally:
        other.delete()


def test_writes_outside_app_and_tmp_fail(sandbox: Sandbox) -> None:
    marker = f"written-{uuid.uuid4().hex[:8]}"
    targets = ["/", "/usr", "/usr/bin", "/etc", "/opt", "/opt/python-base", "/proc/sys/kernel", str(REPO)]
    result = inside(sandbox, "; ".join(f"(echo x > {folder}/{marker}) 2>/dev/null && echo WROTE {folder}"
                                       for folder in targets) + f"; echo ok > /app/{marker}; echo ok > /tmp/{marker}")
    assert "WROTE" not in result.stdout, result
    assert not (REPO / marker).exists()
    assert sandbox.read_file(f"/app/{marker}") == b"ok\n" and sandbox.read_file(f"/tmp/{marker}") == b"ok\n"


def test_host_files_are_not_reached_through_a_symlink(sandbox: Sandbox, readable_tmp: Path) -> None:
    """A link the code makes in /app to a host path is not followed by read_file/write_file on the host."""
    secret = readable_tmp / "secret.txt"
    secret.write_text("HOST-FILE-8a3b")
    secret.chmod(0o666)
    inside(sandbox, f"ln -s {secret} /app/link; ln -s {readable_tmp} /app/folder")
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("link")
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("folder/secret.txt")
    with contextlib.suppress(local.SandboxError):
        sandbox.write_file("link", b"overwritten")
    with contextlib.suppress(local.SandboxError):
        sandbox.write_file("folder/new.txt", b"new")
    assert secret.read_text() == "HOST-FILE-8a3b" and not (readable_tmp / "new.txt").exists()


PTRACE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
print("ptrace", libc.ptrace(16, pid, 0, 0), os.strerror(ctypes.get_errno()))  # PTRACE_ATTACH
try:
    os.kill(pid, 9)
    print("SIGNALLED")
except OSError as error:
    print("kill:", error)
"""


def test_host_processes_are_invisible_and_untouchable(sandbox: Sandbox) -> None:
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "host-process-3e9d"])
    try:
        sandbox.write_file("ptrace.py", PTRACE.encode())
        result = inside(sandbox, f"ps -eo pid,args; ls /proc | grep -c '^[0-9]'; kill -9 {host.pid}; "
                                 f"python ptrace.py {host.pid}; python ptrace.py {os.getpid()}")
        assert "host-process-3e9d" not in result.stdout and "pytest" not in result.stdout, result
        assert int(result.stdout.split("\n")[-6]) < 10, result  # the sandbox's own few processes only
        assert "SIGNALLED" not in result.stdout and "ptrace 0 " not in result.stdout, result
        assert host.poll() is None and pid_alive(os.getpid())
    finally:
        host.kill()
        host.wait()



def test_no_host_path_in_a_processs_command_line(sandbox: Sandbox) -> None:
    """`ps` inside shows the sandbox's own processes only, not bwrap's argv (where bwrap lives: the checkout's
    virtual environment, the user's home; its binds and variables), in /proc/*/cmdline or as /proc/1/exe."""
    result = sandbox.execute("ps -eo pid,args; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done; "
                             "readlink /proc/1/exe; echo done", env={"GREETING": "hello-4d2e"}, timeout=20)
    assert result.stdout.endswith("done\n") and "hello-4d2e" not in result.stdout, result
    host = [str(REPO), sys.prefix, os.path.dirname(local.bwrap_path() or "/nowhere/bwrap"),
            os.path.realpath(sandbox.folder), "bwrap", "--bind", "--setenv", "GREETING"]
    for text in host:
        assert text not in result.stdout, (text, result.stdout)

FORKS = """
import os, time
n = 0
try:
    while n < 100000:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as error:
    print(n, error)
"""


def test_a_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    sandbox.write_file("forks.py", FORKS.encode())
    started = time.monotonic()
    counted = inside(sandbox, "python forks.py")
    assert int(counted.stdout.split()[0]) < 300, counted  # RLIMIT_NPROC, counted in the sandbox's namespace
    bomb = inside(sandbox, "f(){ f|f& }; f; sleep 0.5", timeout=15)
    assert not bomb.timed_out and "Cannot fork" in bomb.stderr, bomb
    assert time.monotonic() - started < 15
    assert subprocess.run(["true"]).returncode == 0  # the host still forks
    if sandbox.spec.start_command:  # what the bomb left goes on in the sandbox (as in a container) until its end
        left = sandbox.processes()
        sandbox.delete()
        assert left and not [pid for pid in left if pid_alive(pid)]
    assert sandbox.processes() == []


def test_a_memory_bomb_is_refused(sandbox: Sandbox) -> None:
    result = inside(sandbox, "python -c 'x = []\nwhile True: x.append(bytearray(50 << 20))'")
    assert result.oom and "MemoryError" in result.stderr and result.exit_code != 0, result
    big = inside(sandbox, "python -c 'bytearray(8 << 30)'")
    assert big.oom, big


def test_a_10_gb_file_is_cut_at_the_disk_limit(sandbox: Sandbox) -> None:
    result = inside(sandbox, "head -c 10G /dev/zero > /app/big; echo $?")
    assert result.stdout.strip() not in ("", "0"), result  # SIGXFSZ: RLIMIT_FSIZE is disk_size_gb (20 MB here)
    assert (Path(os.path.realpath(sandbox.folder)) / "app" / "big").stat().st_size <= 0.02 * (1 << 30)
    many = inside(sandbox, "i=0; while :; do head -c 1M /dev/zero > /tmp/f$i; i=$((i+1)); done", timeout=30)
    assert "disk limit" in many.stderr and not many.timed_out, many  # many small files: the disk accounting
    assert many.seconds < 3 and sandbox.disk_used() < 1 << 30, many  # measured after 0.1 s, 0.2 s, 0.4 s, ...


@ALONE
def test_an_infinite_loop_times_out(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.execute("while :; do :; done", timeout=1)
    assert result.timed_out and result.exit_code == 124 and time.monotonic() - started < 5, result
    assert sandbox.processes() == []


@ALONE
def test_a_background_process_ends_with_its_command(sandbox: Sandbox) -> None:
    marker = f"left-behind-{uuid.uuid4().hex[:8]}"
    result = inside(sandbox, f"python -c 'import time; time.sleep(300)' {marker} & "
                             f"setsid nohup python -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 & "
                             f"(python -c 'import os, time; os.fork() or time.sleep(300)' {marker} &) ; echo started")
    assert "started" in result.stdout and result.seconds < 5, result
    assert gone(marker) and sandbox.processes() == []


def test_no_privileges(sandbox: Sandbox) -> None:
    """setuid, a new user namespace, mount, chroot: each refused; no capabilities at all."""
    result = inside(sandbox, "unshare -U true && echo USERNS-OK; unshare -r true && echo USERNS-OK; "
                             "mount -t tmpfs none /tmp && echo MOUNT-OK; chroot / true && echo CHROOT-OK; "
                             "python -c 'import os; os.setuid(0); print(\"SETUID-OK\")'; "
                             "python -c 'import os; os.setgid(0); print(\"SETGID-OK\")'; "
                             "grep CapEff /proc/self/status")
    assert "-OK" not in result.stdout, result
    assert result.stdout.split()[-1] == "0000000000000000", result


def test_no_keys_in_the_environment(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO_API_KEY", "sk-foo-4b1d")
    monkeypatch.setenv("PRIME_LAB_SECRET_TEST", "lab-secret-aa01")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-77c2")
    result = inside(sandbox, "env; cat /proc/1/environ | tr '\\0' '\\n'")
    for secret in ("sk-foo-4b1d", "lab-secret-aa01", "aws-secret-77c2", "FOO_API_KEY", "PRIME_LAB"):
        assert secret not in result.stdout, result
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "MALLOC_ARENA_MAX", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", "PWD",
                     "SHLVL", "_"}, names


def test_nothing_is_left_running_after_delete(sandbox: Sandbox) -> None:
    marker = f"after-delete-{uuid.uuid4().hex[:8]}"
    sandbox.start_job(f"python -c 'import time; time.sleep(300)' {marker}")
    running = threading.Thread(target=sandbox.execute,
                               args=(f"python -c 'import time; time.sleep(300)' {marker}",), daemon=True)
    running.start()
    assert appears(marker, 2)
    sandbox.delete()
    running.join(timeout=5)
    assert gone(marker, within=0) and not running.is_alive() and not os.path.exists(sandbox.folder)
    with pytest.raises(local.SandboxGone):
        local.get(sandbox.id)


@pytest.mark.parametrize("start_command", list(KINDS.values()), ids=list(KINDS))
def test_the_runs_reaper_ends_its_sandboxes(tmp_path: Path, start_command: str | None) -> None:
    """A run's sandboxes are recorded in its folder: Run.end_processes (the reaper, restart) kills what runs there,
    and once the run is final its sandboxes are gone."""
    from prime_lab.runs.registry import Run

    run_dir = tmp_path / "runs" / "rl-sbx001"
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"id": "rl-sbx001", "state": "running", "processes": {}}))
    sandbox = local.create(SandboxSpec(run_dir=str(run_dir), start_command=start_command))
    try:
        marker = f"run-job-{uuid.uuid4().hex[:8]}"
        sandbox.start_job(f"python -c 'import time; time.sleep(300)' {marker}")
        assert appears(marker)
        assert Run(run_dir).end_processes(grace=5) == []
        assert gone(marker) and gone("held-worker")
        (run_dir / "status.json").write_text(json.dumps({"id": "rl-sbx001", "state": "failed"}))
        with pytest.raises(local.SandboxGone, match="failed"):
            local.get(sandbox.id)
        assert not os.path.exists(sandbox.folder)
    finally:
        sandbox.delete()


def test_with_a_start_command_a_timeout_kills_the_commands_group_and_the_lifetime_ends_the_rest() -> None:
    """In a sandbox with a start command, what a command leaves in the background lives on for later commands (as in
    a container of Prime's); past its timeout a command's process group is killed; when the sandbox's lifetime ends,
    everything in it ends with no delete() (its holder exits, and its PID namespace with it)."""
    marker = f"held-{uuid.uuid4().hex[:8]}"
    sandbox = local.create(SandboxSpec(start_command=KINDS["held"], timeout_minutes=0.04))  # 2.4 s
    try:
        left = inside(sandbox, f"setsid python -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 & echo $!")
        assert inside(sandbox, f"[ -d /proc/{left.stdout.strip()} ] && echo there").stdout == "there\n"
        slow = sandbox.execute(f"python -c 'import time; time.sleep(300)' {marker}-group & "
                               f"python -c 'while True: pass'", timeout=0.5)
        assert slow.timed_out and slow.exit_code == 124, slow
        assert gone(f"{marker}-group") and len(leftovers(marker)) == 1 and leftovers("held-worker")
        assert gone(marker, within=10) and gone("held-worker", within=0)  # the lifetime's end
        assert sandbox.processes() == []
    finally:
        sandbox.delete()


CREATOR = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("sandbox_local", sys.argv[1])
local = sys.modules["sandbox_local"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(local)
made = local.create(local.SandboxSpec(start_command=sys.argv[2]))
print(made.id, flush=True)
sys.stdin.read()  # until the test has seen its worker start
"""


def test_a_sandbox_with_a_start_command_ends_with_the_process_that_made_it() -> None:
    """Its one bwrap is started by a thread of the process that made it that lives as long as the process
    (--die-with-parent): when that process exits, or is killed, everything in the sandbox ends."""
    marker = f"creator-{uuid.uuid4().hex[:8]}"
    start = str(KINDS["held"]).replace("held-worker", marker)
    maker = subprocess.Popen([sys.executable, "-c", CREATOR, local.__file__, start], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert maker.stdout is not None and maker.stdin is not None
        sandbox_id = maker.stdout.readline().strip()
        assert appears(marker)
        maker.kill()
        maker.wait()
        assert gone(marker)
    finally:
        maker.kill()
        maker.wait()
        with contextlib.suppress(local.SandboxGone):
            local.get(sandbox_id).delete()
